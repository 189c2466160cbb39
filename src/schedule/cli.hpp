// `pipetrain schedule NAME|file:PATH --pp P --micro-batches M [--virtual-stages V] [--csv]`:
// prints a schedule's compute actions per rank (or its CSV, which parallel.schedule =
// "file:PATH" runs), its simulated bubble and peak live micro-batches per rank. One process.
#pragma once

namespace pt {

// argv[0] is "schedule". Returns the exit code: 0, or 2 for a bad name, file or shape.
int schedule_main(int argc, char** argv);

} // namespace pt
