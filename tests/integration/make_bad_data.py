#!/usr/bin/env python3
"""Writes damaged token files for the bad-input tests into the directory given."""
import os
import struct
import sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)


def token_file(path, tokens, magic=20240520, version=1, count=None, trailing=b""):
    header = [0] * 256
    header[0], header[1], header[2] = magic, version, len(tokens) if count is None else count
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))
        f.write(trailing)


good = [i % 200 for i in range(4096)]
token_file(os.path.join(out, "bad_magic.bin"), good, magic=12345)
token_file(os.path.join(out, "bad_version.bin"), good, version=7)
token_file(os.path.join(out, "truncated.bin"), good, count=len(good) + 100)
token_file(os.path.join(out, "too_short.bin"), good[:10])
token_file(os.path.join(out, "big_token.bin"), good[:-1] + [60000])
with open(os.path.join(out, "not_tokens.bin"), "wb") as f:
    f.write(b"hello")
print("bad token files in", out)
