// Deck parsing: defaults, derived values, overrides, round trip, and messages of bad decks that
// the command-line tests (tests/integration/CMakeLists.txt) do not reach.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "config/deck_keys.hpp"
#include "config/run_config.hpp"
#include "util/errors.hpp"

namespace pt {
namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

const std::string kTiny = read(PT_SOURCE_DIR "/inputs/tiny.toml");

// The message of the bad_input error parse_deck throws, or "" when it accepts the deck.
std::string error_of(const std::string& text, const std::vector<std::string>& ov, int ranks = 2) {
  try {
    parse_deck(text, "deck.toml", ov, ranks);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input);
    return e.what();
  }
  return "";
}

// The defaults live once, in RunConfig's initializers and the architecture's resolver: for
// every architecture, a RunConfig made in code with the required keys set and validated equals
// the one parsed from a deck of only those keys.
TEST(Config, MadeInCodeEqualsParsedMinimalDeck) {
  for (const Arch arch : {Arch::gpt2, Arch::llama}) {
    SCOPED_TRACE(name(arch));
    const std::string deck = "[model]\narch = \"" + std::string(name(arch)) +
                             "\"\nn_layer = 4\nn_head = 4\nd_model = 64\nseq_len = 32\n"
                             "vocab_size = 256\n[train]\nsteps = 10\nglobal_batch = 8\n"
                             "micro_batch = 2\n[data]\npath = \"x.bin\"\n";
    const RunConfig parsed = parse_deck(deck, "minimal.toml", {}, 2);
    RunConfig made;
    made.model.arch = arch;
    made.model.n_layer = 4;
    made.model.n_head = 4;
    made.model.d_model = 64;
    made.model.seq_len = 32;
    made.model.vocab_size = 256;
    made.train.steps = 10;
    made.train.global_batch = 8;
    made.train.micro_batch = 2;
    made.data.path = "x.bin";
    validate(made, 2);
    EXPECT_EQ(made.model, parsed.model);
    EXPECT_EQ(made.parallel, parsed.parallel);
    EXPECT_EQ(made.train, parsed.train);
    EXPECT_EQ(made.data, parsed.data);
    EXPECT_EQ(made.checkpoint, parsed.checkpoint);
    EXPECT_EQ(made.comm, parsed.comm);
    EXPECT_EQ(made.device, parsed.device);
    EXPECT_EQ(made.log, parsed.log);
    EXPECT_EQ(made.runtime, parsed.runtime);
    EXPECT_EQ(*parsed.model.tie_embeddings, arch == Arch::gpt2); // resolved, per architecture
    EXPECT_EQ(parsed.runtime.hang_timeout_s, 600.0);             // one default, in the struct
    EXPECT_EQ(parsed.parallel.dp, 2);
    EXPECT_DOUBLE_EQ(*parsed.train.min_lr, parsed.train.lr / 10.0);
    // and a rule between keys names the key for a RunConfig made in code too
    made.parallel.tp = 3;
    EXPECT_THROW(validate(made, 2), Error);
  }
}

// A checkpoint resumes only under the same model description (checkpoint/read.cpp). Every
// [model] key of the deck table is part of it: for each key, a deck changed in that key alone
// gives a description that differs in that key. A key added to the table without a
// value below fails here, so no model key can be left out of the resume check.
TEST(Config, ModelDescriptionComparesEveryModelKey) {
  const std::map<std::string, std::string> other = {
      {"arch", "\"gpt2\""},       {"n_layer", "6"},    {"n_head", "8"},
      {"d_model", "128"},         {"seq_len", "64"},   {"vocab_size", "512"},
      {"tie_embeddings", "true"}, {"n_kv_head", "2"},  {"ffn_hidden", "512"},
      {"rope_theta", "500000.0"}, {"norm_eps", "1e-6"}};
  const std::string llama = "[model]\narch = \"llama\"\nn_layer = 4\nn_head = 4\nd_model = 64\n"
                            "seq_len = 32\nvocab_size = 256\n[train]\nsteps = 10\n"
                            "global_batch = 8\nmicro_batch = 2\n[data]\npath = \"x.bin\"\n";
  const auto base = model_description(parse_deck(llama, "llama.toml", {}, 2).model);
  for (const DeckKey& k : deck_keys()) {
    if (k.section != "model") continue;
    SCOPED_TRACE(k.name);
    ASSERT_TRUE(other.count(k.name)) << "give model." << k.name << " another value here";
    const ModelConfig m =
        parse_deck(llama, "llama.toml", {"model." + k.name + "=" + other.at(k.name)}, 2).model;
    const auto changed = model_description(m);
    ASSERT_EQ(changed.size(), base.size());
    bool compared = false; // derived keys may change with it (n_head: n_kv_head's default)
    for (std::size_t i = 0; i < base.size(); ++i) {
      if (base[i].first == k.name) compared = base[i].second != changed[i].second;
    }
    EXPECT_TRUE(compared) << "model." << k.name << " changed, its description did not";
  }
  // derived values count as what they resolve to: n_kv_head = 0 is n_head, 4 here
  const ModelConfig same = parse_deck(llama, "llama.toml", {"model.n_kv_head=4"}, 2).model;
  EXPECT_EQ(model_description(same), base);
}

TEST(Config, ModelDescriptionComparesTheMoeKeysThatShapeTheModel) {
  const std::string deck = "[model]\nn_layer = 4\nn_head = 4\nd_model = 64\nseq_len = 32\n"
                           "vocab_size = 256\n[moe]\nexperts = 4\n[train]\nsteps = 10\n"
                           "global_batch = 8\nmicro_batch = 2\n[data]\npath = \"x.bin\"\n";
  const auto base = model_description(parse_deck(deck, "moe.toml", {}, 1).model);
  const std::map<std::string, std::string> other = {
      {"experts", "8"},    {"top_k", "1"},          {"ffn_hidden", "128"},
      {"every", "2"},      {"shared_experts", "1"}, {"capacity_factor", "1.5"},
      {"aux_loss", "0.1"}, {"z_loss", "0.001"}};
  for (const DeckKey& k : deck_keys()) {
    if (k.section != "moe") continue;
    SCOPED_TRACE(k.name);
    ASSERT_TRUE(other.count(k.name)) << "give moe." << k.name << " another value here";
    const auto changed = model_description(
        parse_deck(deck, "moe.toml", {"moe." + k.name + "=" + other.at(k.name)}, 1).model);
    // the router's training terms and the capacity do not make another model
    const bool training = k.name == "capacity_factor" || k.name == "aux_loss" || k.name == "z_loss";
    EXPECT_EQ(changed == base, training);
  }
  // a dense model: the [moe] keys do nothing and are not compared
  const std::string dense = deck.substr(0, deck.find("[moe]")) + deck.substr(deck.find("[train]"));
  EXPECT_EQ(
      model_description(parse_deck(dense, "d.toml", {}, 1).model),
      model_description(parse_deck(dense, "d.toml", {"moe.top_k=1", "moe.every=3"}, 1).model));
  // the expert width 0 is the dense MLP's: 4 d_model for gpt2
  EXPECT_EQ(model_description(parse_deck(deck, "moe.toml", {"moe.ffn_hidden=256"}, 1).model), base);
}

TEST(Config, TinyDeckDerivesDataParallelismFromRanks) {
  // tiny.toml: pp = 2, global batch 16 of micro-batch 4
  const RunConfig one = parse_deck(kTiny, "tiny.toml", {}, 2);
  EXPECT_EQ(one.parallel.dp, 1);
  EXPECT_EQ(one.accumulation(), 4);
  const RunConfig two = parse_deck(kTiny, "tiny.toml", {}, 4);
  EXPECT_EQ(two.parallel.dp, 2);
  EXPECT_EQ(two.accumulation(), 2);
  EXPECT_EQ(two.parallel.micro_batches, 2);
  EXPECT_EQ(two.model.n_layer, 4);
  EXPECT_DOUBLE_EQ(two.train.lr, 3e-3);
  EXPECT_DOUBLE_EQ(*two.train.min_lr, 3e-4);
  EXPECT_EQ(two.data.path, "data/fortunes.bin");
}

TEST(Config, DefaultsAreFilledIn) {
  const RunConfig c = parse_deck(kTiny, "tiny.toml", {"train.min_lr=0.0001"}, 2);
  EXPECT_DOUBLE_EQ(c.train.beta2, 0.95);
  EXPECT_EQ(c.parallel.schedule, ScheduleKind::one_f_one_b);
  EXPECT_TRUE(tied(c.model));
  EXPECT_FALSE(c.comm.allreduce.has_value()); // "auto"
  EXPECT_EQ(c.comm.gpu_collectives, GpuTransport::automatic);
  EXPECT_EQ(c.comm.gpu_p2p, GpuTransport::mpi);
  EXPECT_EQ(c.device.kind, DeviceKind::host);
  const RunConfig d =
      parse_deck("[model]\nn_layer=1\nn_head=1\nd_model=8\nseq_len=4\nvocab_size=16\n"
                 "[train]\nsteps=1\nglobal_batch=1\nmicro_batch=1\nlr=0.01\n[data]\npath=\"x\"\n",
                 "d.toml", {}, 1);
  EXPECT_DOUBLE_EQ(*d.train.min_lr, 0.001); // lr / 10
}

TEST(Config, OverridesApplyInOrderAndLastWins) {
  const RunConfig c = parse_deck(
      kTiny, "tiny.toml",
      {"train.steps=50", "train.steps=70", "data.path=other/file.bin", "train.lr=1", "log.every=3"},
      2);
  EXPECT_EQ(c.train.steps, 70);
  EXPECT_EQ(c.data.path, "other/file.bin"); // bare string, no quotes needed
  EXPECT_DOUBLE_EQ(c.train.lr, 1.0);        // an integer is accepted for a float key
  EXPECT_EQ(c.log.every, 3);
}

TEST(Config, StringKeysBecomeEnumsAndPrintAsTheDeckSpellsThem) {
  const RunConfig c = parse_deck(
      kTiny, "tiny.toml",
      {"parallel.schedule=zb-h1", "parallel.partition=params", "comm.allreduce=recursive-doubling",
       "comm.topology=fat-tree", "comm.overlap=thread", "device.kind=cuda", "device.precision=bf16",
       "comm.gpu_collectives=mpi", "comm.gpu_p2p=nccl"},
      2);
  EXPECT_EQ(c.parallel.schedule, ScheduleKind::zb_h1);
  EXPECT_EQ(c.parallel.partition, PartitionKind::params);
  EXPECT_EQ(c.comm.allreduce, AllreduceAlgo::recursive_doubling);
  EXPECT_EQ(c.comm.topology, TopologyKind::fat_tree);
  EXPECT_EQ(c.comm.overlap, Overlap::thread);
  EXPECT_EQ(c.device.kind, DeviceKind::cuda);
  EXPECT_EQ(c.device.precision, Precision::bf16);
  EXPECT_EQ(c.comm.gpu_collectives, GpuTransport::mpi);
  EXPECT_EQ(c.comm.gpu_p2p, GpuTransport::nccl);
  for (const char* line :
       {"schedule = 'zb-h1'", "partition = 'params'", "allreduce = 'recursive-doubling'",
        "topology = 'fat-tree'", "precision = 'bf16'"}) {
    EXPECT_NE(c.resolved_text.find(line), std::string::npos) << line << " in\n" << c.resolved_text;
  }
  const RunConfig e = parse_deck(kTiny, "tiny.toml", {"parallel.partition=[2, 2]"}, 2);
  EXPECT_EQ(e.parallel.partition, PartitionKind::explicit_layers);
  EXPECT_EQ(std::string(name(e.parallel.partition)), "explicit");
  EXPECT_NE(error_of(kTiny, {"parallel.schedule=1F1B"})
                .find("= \"1F1B\" is not one of "
                      "gpipe|1f1b|interleaved|zb-h1|zb-h2|zb-v|v-half|v-min|dualpipev|2bw|search; "
                      "did you mean '1f1b'?"),
            std::string::npos);
  EXPECT_NE(error_of(kTiny, {"comm.overlap=poll", "comm.allreduce=ring"})
                .find("cannot run comm.allreduce = \"ring\""),
            std::string::npos);
  EXPECT_EQ(error_of(kTiny, {"comm.overlap=poll", "comm.allreduce=mpi"}), "");
}

TEST(Config, ResolvedDeckParsesBackToTheSameRun) {
  const RunConfig a = parse_deck(kTiny, "tiny.toml", {"train.steps=42", "model.n_layer=3"}, 2);
  const RunConfig b = parse_deck(a.resolved_text, "resolved.toml", {}, 2);
  EXPECT_EQ(b.train.steps, 42);
  EXPECT_EQ(b.model.n_layer, 3);
  EXPECT_DOUBLE_EQ(*b.train.min_lr, *a.train.min_lr);
  EXPECT_EQ(b.train.seed, a.train.seed);
  EXPECT_EQ(b.resolved_text, a.resolved_text);
}

TEST(Config, ErrorsNameLineKeyAndFix) {
  EXPECT_NE(error_of(kTiny, {"model.seq_len=0"}).find("model.seq_len = 0 is out of range"),
            std::string::npos);
  // the deck's own line number is reported
  const std::string e = error_of("[model]\nn_layer = 1.5\n", {});
  EXPECT_NE(e.find("deck.toml:2: model.n_layer = 1.5 must be an integer"), std::string::npos) << e;
  EXPECT_NE(error_of(kTiny, {"parallel.micro_batches=3"}).find("disagrees with"),
            std::string::npos);
  EXPECT_NE(error_of(kTiny, {"train.min_lr=1"}).find("train.min_lr = 1 is out of range"),
            std::string::npos);
  EXPECT_NE(error_of(kTiny, {"model.vocab_size=20000000"}).find("[2, 16777216]"),
            std::string::npos);
  EXPECT_NE(error_of(kTiny, {"model.tie_embeddings=1"}).find("must be true or false"),
            std::string::npos);
  EXPECT_NE(error_of(kTiny, {"data.path=\"\""}).find("data.path is empty"), std::string::npos);
  EXPECT_NE(error_of(kTiny, {"parallel.pp=3"}, 2).find("does not divide the job's 2 ranks"),
            std::string::npos);
  EXPECT_NE(error_of(kTiny, {"model=3"}).find("is not an override"), std::string::npos);
  EXPECT_NE(error_of(kTiny, {"a.b.c=3"}).find("is not an override"), std::string::npos);
  EXPECT_NE(error_of(kTiny, {"parallel.partition=[1, 2]"}).find("needs pp*virtual_stages = 2"),
            std::string::npos);
  EXPECT_EQ(error_of(kTiny, {"parallel.partition=[1, 3]"}), "");
  EXPECT_NE(error_of(kTiny, {"model.n_layer=0"}).find("[1, 4096]"), std::string::npos);
}

} // namespace
} // namespace pt
