// kz-profile: where the time of a llama.cpp prefill and decode goes, node by node.
//
// Plain C++ against llama.cpp's public API (llama.h) and ggml-backend's scheduler eval callback
// (llama_context_params::cb_eval, a ggml_backend_sched_eval_callback). The scheduler asks the
// callback about every node of every split; a node the callback wants is computed on its own,
// the backend is synchronized, and the callback is called again. The time between the two calls
// is the node's time, including that synchronization. Nodes that do no work (views, reshapes,
// permutes, transposes) are not asked for: they run with the next node.
//
// Because every observed node is followed by a synchronization, the timer slows the run down.
// So each repetition runs the same work twice: once on a context without the callback ("plain")
// and once on a context with it ("timed"), and both wall times are reported side by side.
//
// The backend of a node is the device of the buffer its result was allocated in: the scheduler
// allocates a node's result in the compute buffer of the backend that runs it.
//
// The node times are kept per repetition, so that each repetition's op times and its timed wall
// time come from the same graph run.
//
// Output: one JSON object on stdout (format 2: a node's "us" is a list, one time per repetition). Logs, and with -v every ggml log line (the
// "ggml-hex: ... profile-op" lines of GGML_HEXAGON_PROFILE=1 are debug lines), go to stderr,
// between "kz-profile: phase PHASE MODE rep N begin|end" markers.

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

bool g_verbose = false;

void log_callback(ggml_log_level level, const char * text, void *) {
    if (g_verbose || level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
        std::fflush(stderr);
    }
}

[[noreturn]] void fail(const char * fmt, ...) {
    std::va_list args;
    va_start(args, fmt);
    std::fputs("kz-profile: error: ", stderr);
    std::vfprintf(stderr, fmt, args);
    std::fputs("\n", stderr);
    va_end(args);
    std::exit(1);
}

struct Options {
    std::string model;
    int n_prompt = 512;
    int n_gen = 16;
    int n_ubatch = 0;   // 0: llama.cpp's default
    int n_threads = 0;  // 0: llama.cpp's default
    int n_gpu_layers = -2;  // -2: llama.cpp's default
    std::string devices;    // "" default, "none", or NAME[/NAME...]
    int reps = 1;
};

int parse_count(const char * flag, const char * value, int minimum) {
    char * end = nullptr;
    const long parsed = std::strtol(value, &end, 10);
    if (end == value || *end != '\0' || parsed < minimum || parsed > 1000000000L) {
        fail("%s '%s' is not a whole number >= %d", flag, value, minimum);
    }
    return (int) parsed;
}

Options parse_args(int argc, char ** argv) {
    Options opt;
    for (int i = 1; i < argc; i++) {
        const std::string arg = argv[i];
        if (arg == "-v") {
            g_verbose = true;
            continue;
        }
        if (i + 1 >= argc) {
            fail("%s needs a value (usage: kz-profile -m MODEL [-p N] [-n N] [-ub N] [-t N] [-ngl N] [-dev LIST] [-r N] [-v])", arg.c_str());
        }
        const char * value = argv[++i];
        if (arg == "-m") {
            opt.model = value;
        } else if (arg == "-p") {
            opt.n_prompt = parse_count("-p", value, 1);
        } else if (arg == "-n") {
            opt.n_gen = parse_count("-n", value, 0);
        } else if (arg == "-ub") {
            opt.n_ubatch = parse_count("-ub", value, 1);
        } else if (arg == "-t") {
            opt.n_threads = parse_count("-t", value, 1);
        } else if (arg == "-ngl") {
            opt.n_gpu_layers = parse_count("-ngl", value, 0);
        } else if (arg == "-dev") {
            opt.devices = value;
        } else if (arg == "-r") {
            opt.reps = parse_count("-r", value, 1);
        } else {
            fail("unknown option '%s'", arg.c_str());
        }
    }
    if (opt.model.empty()) {
        fail("-m MODEL is required");
    }
    return opt;
}

// what the timer has seen of one phase: (op, backend, layer) -> count, and microseconds per repetition
using NodeKey = std::tuple<std::string, std::string, int>;
struct NodeTotal {
    long long count = 0;
    std::vector<double> usec;  // [rep]
};

struct Timer {
    std::map<NodeKey, NodeTotal> * sink = nullptr;  // the phase being measured
    size_t rep = 0;                                  // the repetition being measured
    Clock::time_point started;
};

bool does_work(const ggml_tensor * t) {
    switch (t->op) {
        case GGML_OP_NONE:
        case GGML_OP_VIEW:
        case GGML_OP_RESHAPE:
        case GGML_OP_PERMUTE:
        case GGML_OP_TRANSPOSE:
            return false;
        default:
            return true;
    }
}

// llama.cpp names a layer's tensors NAME-IL ("attn_norm-3"); -1 for tensors of no layer
int layer_of(const char * name) {
    const char * dash = std::strrchr(name, '-');
    if (dash == nullptr || dash[1] == '\0') {
        return -1;
    }
    for (const char * c = dash + 1; *c; c++) {
        if (*c < '0' || *c > '9') {
            return -1;
        }
    }
    return std::atoi(dash + 1);
}

std::string backend_of(const ggml_tensor * t) {
    const ggml_tensor * base = t->view_src ? t->view_src : t;
    if (base->buffer == nullptr) {
        return "unknown";
    }
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(base->buffer);
    ggml_backend_dev_t dev = buft ? ggml_backend_buft_get_device(buft) : nullptr;
    return dev ? ggml_backend_dev_name(dev) : ggml_backend_buffer_name(base->buffer);
}

bool eval_callback(ggml_tensor * t, bool ask, void * user_data) {
    auto * timer = static_cast<Timer *>(user_data);
    if (ask) {
        if (timer->sink == nullptr || !does_work(t)) {
            return false;
        }
        timer->started = Clock::now();  // the scheduler computes this node next, then synchronizes
        return true;
    }
    const double usec = std::chrono::duration<double, std::micro>(Clock::now() - timer->started).count();
    NodeTotal & total = (*timer->sink)[NodeKey(ggml_op_desc(t), backend_of(t), layer_of(t->name))];
    total.count += 1;
    if (total.usec.size() <= timer->rep) {
        total.usec.resize(timer->rep + 1, 0.0);
    }
    total.usec[timer->rep] += usec;
    return true;
}

struct Phase {
    std::string name;
    int tokens = 0;
    std::vector<double> wall_plain;
    std::vector<double> wall_timed;
    std::map<NodeKey, NodeTotal> nodes;
};

void decode_or_fail(llama_context * ctx, llama_token * tokens, int n) {
    const int32_t status = llama_decode(ctx, llama_batch_get_one(tokens, n));
    if (status != 0) {
        fail("llama_decode of %d tokens returned %d", n, (int) status);
    }
}

// one prefill of the prompt and one decode of n_gen tokens on a fresh KV cache; the wall time
// of each goes to the phase (when given), its nodes to the timer's sink
void run_once(llama_context * ctx, std::vector<llama_token> & prompt, int n_gen, Timer * timer,
              Phase * prefill, Phase * decode, const char * mode, int rep) {
    llama_memory_clear(llama_get_memory(ctx), true);
    const bool timed = timer != nullptr;
    const bool record = prefill != nullptr;
    if (timed) timer->rep = (size_t) rep;

    if (record) std::fprintf(stderr, "kz-profile: phase prefill %s rep %d begin\n", mode, rep);
    if (timed) timer->sink = record ? &prefill->nodes : nullptr;
    auto started = Clock::now();
    decode_or_fail(ctx, prompt.data(), (int) prompt.size());
    llama_synchronize(ctx);
    double usec = std::chrono::duration<double, std::micro>(Clock::now() - started).count();
    if (record) {
        (timed ? prefill->wall_timed : prefill->wall_plain).push_back(usec);
        std::fprintf(stderr, "kz-profile: phase prefill %s rep %d end\n", mode, rep);
    }

    if (n_gen == 0) {
        if (timed) timer->sink = nullptr;
        return;
    }
    if (record) std::fprintf(stderr, "kz-profile: phase decode %s rep %d begin\n", mode, rep);
    if (timed) timer->sink = record ? &decode->nodes : nullptr;
    llama_token token = prompt.back();
    started = Clock::now();
    for (int i = 0; i < n_gen; i++) {
        decode_or_fail(ctx, &token, 1);
    }
    llama_synchronize(ctx);
    usec = std::chrono::duration<double, std::micro>(Clock::now() - started).count();
    if (timed) timer->sink = nullptr;
    if (record) {
        (timed ? decode->wall_timed : decode->wall_plain).push_back(usec);
        std::fprintf(stderr, "kz-profile: phase decode %s rep %d end\n", mode, rep);
    }
}

std::string json_string(const std::string & text) {
    std::string out = "\"";
    for (const unsigned char c : text) {
        if (c == '"' || c == '\\') {
            out += '\\';
            out += (char) c;
        } else if (c < 0x20) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\u%04x", c);
            out += buf;
        } else {
            out += (char) c;
        }
    }
    return out + "\"";
}

void print_numbers(const std::vector<double> & values) {
    std::printf("[");
    for (size_t i = 0; i < values.size(); i++) {
        std::printf("%s%.3f", i ? "," : "", values[i]);
    }
    std::printf("]");
}

}  // namespace

int main(int argc, char ** argv) {
    Options opt = parse_args(argc, argv);
    llama_log_set(log_callback, nullptr);
    ggml_backend_load_all();
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    std::vector<ggml_backend_dev_t> devices;
    if (!opt.devices.empty()) {
        if (opt.devices != "none") {
            size_t start = 0;
            while (start <= opt.devices.size()) {
                const size_t slash = opt.devices.find('/', start);
                const std::string name = opt.devices.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
                ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
                if (dev == nullptr) {
                    fail("no device '%s' in this build", name.c_str());
                }
                devices.push_back(dev);
                if (slash == std::string::npos) break;
                start = slash + 1;
            }
        }
        devices.push_back(nullptr);
        mparams.devices = devices.data();
    }
    if (opt.n_gpu_layers != -2) {
        mparams.n_gpu_layers = opt.n_gpu_layers;
    }
    llama_model * model = llama_model_load_from_file(opt.model.c_str(), mparams);
    if (model == nullptr) {
        fail("cannot load model '%s'", opt.model.c_str());
    }

    Timer timer;
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = (uint32_t) (opt.n_prompt + opt.n_gen + 16);
    cparams.n_batch = (uint32_t) opt.n_prompt;
    if (opt.n_ubatch) cparams.n_ubatch = (uint32_t) opt.n_ubatch;
    if (opt.n_threads) cparams.n_threads = cparams.n_threads_batch = opt.n_threads;
    cparams.no_perf = true;
    llama_context * plain = llama_init_from_model(model, cparams);
    cparams.cb_eval = eval_callback;
    cparams.cb_eval_user_data = &timer;
    llama_context * timed = llama_init_from_model(model, cparams);
    if (plain == nullptr || timed == nullptr) {
        fail("cannot make a context of %u tokens", cparams.n_ctx);
    }

    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    std::vector<llama_token> prompt((size_t) opt.n_prompt);
    for (int i = 0; i < opt.n_prompt; i++) {
        prompt[(size_t) i] = (llama_token) ((1 + 7919LL * i) % n_vocab);  // any tokens: the work is the same
    }

    Phase prefill{"prefill", opt.n_prompt, {}, {}, {}};
    Phase decode{"decode", opt.n_gen, {}, {}, {}};
    // warm-up of both contexts, not recorded: first-use allocations and kernel caches
    run_once(plain, prompt, opt.n_gen, nullptr, nullptr, nullptr, "warmup", 0);
    run_once(timed, prompt, opt.n_gen, &timer, nullptr, nullptr, "warmup", 0);
    for (int rep = 0; rep < opt.reps; rep++) {
        run_once(plain, prompt, opt.n_gen, nullptr, &prefill, &decode, "plain", rep);
        run_once(timed, prompt, opt.n_gen, &timer, &prefill, &decode, "timed", rep);
    }

    std::printf("{\"tool\":\"kz-profile\",\"format\":2,\"n_prompt\":%d,\"n_gen\":%d,\"n_ubatch\":%u,\"n_threads\":%d,\"reps\":%d,\"phases\":[",
                opt.n_prompt, opt.n_gen, llama_n_ubatch(timed), (int) llama_n_threads_batch(timed), opt.reps);
    bool first_phase = true;
    for (const Phase * phase : {&prefill, &decode}) {
        if (phase->tokens == 0) continue;
        std::printf("%s{\"phase\":%s,\"tokens\":%d,\"wall_us_plain\":", first_phase ? "" : ",", json_string(phase->name).c_str(), phase->tokens);
        first_phase = false;
        print_numbers(phase->wall_plain);
        std::printf(",\"wall_us_timed\":");
        print_numbers(phase->wall_timed);
        std::printf(",\"nodes\":[");
        bool first_node = true;
        for (const auto & [key, total] : phase->nodes) {
            std::vector<double> per_rep = total.usec;
            per_rep.resize((size_t) opt.reps, 0.0);  // a node a later repetition did not run: 0 there
            std::printf("%s{\"op\":%s,\"backend\":%s,\"layer\":%d,\"count\":%lld,\"us\":", first_node ? "" : ",",
                        json_string(std::get<0>(key)).c_str(), json_string(std::get<1>(key)).c_str(), std::get<2>(key), total.count);
            print_numbers(per_rep);
            std::printf("}");
            first_node = false;
        }
        std::printf("]}");
    }
    std::printf("]}\n");

    llama_free(timed);
    llama_free(plain);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
