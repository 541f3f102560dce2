// dflash_ref's reader of llama.cpp: llama.cpp's own speculative loop (its draft-dflash implementation, as
// its speculative-simple example drives it) on a prompt of token ids, greedy, and every tensor llama.cpp
// names in its graphs (cb_eval), pass by pass, in both contexts, written to one file that
// dflash_ref/conformance/engines/llamacpp.py reads. It only reads: the callback copies what was computed.
//
//   llamacpp_run --prompt-ids 1,2,3 --max-new N [--stop-ids 2,5] --dump FILE  [llama.cpp's own options:
//                -m TARGET.gguf -md DRAFT.gguf --spec-type draft-dflash --spec-draft-n-max 3 ...]
//
// The file: records of  u32 name length, name, u32 n_dims, i64 ne[4], u64 n, n float32 values.
// Names: a tensor's own name with its context ("tgt/" or "dft/"); "#prefill", "#draft", "#verify",
// "#process": where the loop is (markers, n = 0); "=prompt", "=layer_ids", "=draft", "=accepted", "=output":
// the loop's token ids; "=target_features": the target's hidden states its DFlash implementation reads.

#include "arg.h"
#include "common.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"
#include "llama-ext.h"  // llama.cpp's own extension API: the target layers a DFlash draft reads, and their features
#include "log.h"
#include "sampling.h"
#include "speculative.h"

#include <cctype>
#include <sys/resource.h>
#include <clocale>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

struct dump_file {
    FILE * f = nullptr;

    void put(const std::string & name, const int64_t ne[4], const std::vector<float> & values) {
        if (!f) {
            return;
        }
        const uint32_t len = (uint32_t) name.size();
        const uint32_t n_dims = 4;
        const uint64_t n = values.size();
        fwrite(&len, sizeof len, 1, f);
        fwrite(name.data(), 1, len, f);
        fwrite(&n_dims, sizeof n_dims, 1, f);
        fwrite(ne, sizeof(int64_t), 4, f);
        fwrite(&n, sizeof n, 1, f);
        if (n) {
            fwrite(values.data(), sizeof(float), n, f);
        }
    }

    void mark(const std::string & name) {
        const int64_t ne[4] = {0, 0, 0, 0};
        put(name, ne, {});
        if (f) {
            fflush(f);
        }
    }

    void tokens(const std::string & name, const std::vector<llama_token> & ids) {
        const int64_t ne[4] = {(int64_t) ids.size(), 1, 1, 1};
        std::vector<float> values(ids.begin(), ids.end());  // token ids < 2^24: exact in float32
        put(name, ne, values);
    }
};

struct context_reader {
    dump_file * dump;
    std::string prefix;  // "tgt/" or "dft/"
    std::vector<std::string> names;  // the tensors kept: these names, or these followed by "-<layer>"
    std::vector<uint8_t> raw;

    bool wanted(const char * name) const {
        for (const auto & n : names) {
            const size_t k = n.size();
            if (strncmp(name, n.c_str(), k) == 0 && (name[k] == '\0' || (name[k] == '-' && isdigit(name[k + 1]) &&
                                                                       strspn(name + k + 1, "0123456789") == strlen(name + k + 1)))) {
                return true;
            }
        }
        return false;
    }
};

// the tensors llama.cpp names in its DFlash graphs (src/models/dflash.cpp) that the kit compares; of the
// target, its logits
static const std::vector<std::string> DRAFT_NAMES = {
    "inp_g_embeddings", "Kcur_injected", "Vcur_injected", "inp_noise_embd", "attn_conv_in", "Qcur", "Kcur", "Vcur",
    "kq_soft_max", "attn_conv_out", "ffn_conv_in", "ffn_conv_out", "l_out", "result_norm", "result_output",
    "dflash2_lattice"};
static const std::vector<std::string> TARGET_NAMES = {"result_output"};

// cb_eval: asked first whether the tensor's data is wanted, then called with it
static bool read_tensor(struct ggml_tensor * t, bool ask, void * user_data) {
    auto * reader = (context_reader *) user_data;
    if (ask) {
        return reader->wanted(t->name);
    }
    if (!reader->wanted(t->name)) {
        return true;
    }
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16 && t->type != GGML_TYPE_BF16 &&
        t->type != GGML_TYPE_I32) {
        return true;
    }
    reader->raw.resize(ggml_nbytes(t));
    ggml_backend_tensor_get(t, reader->raw.data(), 0, reader->raw.size());
    std::vector<float> values((size_t) ggml_nelements(t));
    size_t i = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < t->ne[2]; ++i2) {
            for (int64_t i1 = 0; i1 < t->ne[1]; ++i1) {
                for (int64_t i0 = 0; i0 < t->ne[0]; ++i0) {
                    const uint8_t * p = reader->raw.data() + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
                    float v = 0.0f;
                    switch (t->type) {
                        case GGML_TYPE_F32:  memcpy(&v, p, sizeof v); break;
                        case GGML_TYPE_F16:  v = ggml_fp16_to_fp32(*(const ggml_fp16_t *) p); break;
                        case GGML_TYPE_BF16: v = ggml_bf16_to_fp32(*(const ggml_bf16_t *) p); break;
                        default:             v = (float) *(const int32_t *) p; break;
                    }
                    values[i++] = v;
                }
            }
        }
    }
    reader->dump->put(reader->prefix + t->name, t->ne, values);
    return true;
}

// the target's hidden states the draft gets, as llama.cpp hands them to it: the input of each of its target
// layers (llama_get_embeddings_layer_inp), rows of the last target pass, concatenated per row
static void put_features(dump_file & dump, llama_context * ctx_tgt, const llama_model * model_dft, int32_t n_rows) {
    const int32_t * ids = llama_model_target_layer_ids(model_dft);
    const uint32_t n_ids = llama_model_target_layer_ids_n(model_dft);
    const int32_t n_embd = llama_model_n_embd(llama_get_model(ctx_tgt));
    std::vector<float> values((size_t) n_rows * n_ids * n_embd);
    for (uint32_t k = 0; k < n_ids; ++k) {
        const float * layer = llama_get_embeddings_layer_inp(ctx_tgt, (uint32_t) ids[k]);
        for (int32_t i = 0; i < n_rows && layer; ++i) {
            memcpy(values.data() + ((size_t) i * n_ids + k) * n_embd, layer + (size_t) i * n_embd, n_embd * sizeof(float));
        }
    }
    const int64_t ne[4] = {(int64_t) n_ids * n_embd, n_rows, 1, 1};
    dump.put("=target_features", ne, values);
}

static std::vector<llama_token> parse_ids(const char * text) {
    std::vector<llama_token> ids;
    for (const char * p = text; *p;) {
        char * end = nullptr;
        ids.push_back((llama_token) strtol(p, &end, 10));
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) {
            break;
        }
    }
    return ids;
}

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");

    // our own options, taken out before llama.cpp's parser sees the rest
    std::vector<llama_token> prompt, stops;
    int max_new = 0;
    std::string dump_path;
    std::vector<char *> rest = {argv[0]};
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--prompt-ids" && i + 1 < argc) {
            prompt = parse_ids(argv[++i]);
        } else if (a == "--stop-ids" && i + 1 < argc) {
            stops = parse_ids(argv[++i]);
        } else if (a == "--max-new" && i + 1 < argc) {
            max_new = atoi(argv[++i]);
        } else if (a == "--dump" && i + 1 < argc) {
            dump_path = argv[++i];
        } else {
            rest.push_back(argv[i]);
        }
    }
    if (prompt.empty() || max_new <= 0) {
        fprintf(stderr, "usage: %s --prompt-ids IDS --max-new N [--dump FILE] [--stop-ids IDS] [llama.cpp options]\n", argv[0]);
        return 2;
    }

    common_params params;
    common_init();
    if (!common_params_parse((int) rest.size(), rest.data(), params, LLAMA_EXAMPLE_SPECULATIVE)) {
        return 2;
    }
    const auto limits = common_speculative_get_output_limits(params.n_batch, params.n_parallel,
                                                             common_speculative_n_max(&params.speculative));
    params.n_outputs_max = limits.total;
    params.n_outputs_max_per_seq = limits.per_seq;
    params.warmup = false;

    dump_file dump;  // without --dump: no tensor is read, and the run is timed alone (bench engines)
    if (!dump_path.empty()) {
        dump.f = fopen(dump_path.c_str(), "wb");
        if (!dump.f) {
            fprintf(stderr, "cannot write %s\n", dump_path.c_str());
            return 2;
        }
    }
    context_reader tgt_reader{&dump, "tgt/", TARGET_NAMES, {}};
    context_reader dft_reader{&dump, "dft/", DRAFT_NAMES, {}};

    llama_backend_init();
    params.cb_eval = dump.f ? read_tensor : nullptr;
    params.cb_eval_user_data = &tgt_reader;
    auto init_tgt = common_init_from_params(params);
    llama_model * model_tgt = init_tgt->model();
    llama_context * ctx_tgt = init_tgt->context();
    if (model_tgt == nullptr || ctx_tgt == nullptr) {
        fprintf(stderr, "llama.cpp cannot load the target\n");
        return 3;
    }

    common_speculative_init_result_ptr spec_init;
    {
        common_params params_dft = common_base_params_to_speculative(params);
        params_dft.cb_eval_user_data = &dft_reader;
        spec_init = common_speculative_init_from_params(params_dft, model_tgt, ctx_tgt);
        params.speculative.draft.ctx_tgt = ctx_tgt;
        params.speculative.draft.ctx_dft = spec_init->context();
    }
    llama_context * ctx_dft = params.speculative.draft.ctx_dft;
    if (ctx_dft == nullptr) {
        fprintf(stderr, "llama.cpp cannot load the draft\n");
        return 3;
    }

    const llama_seq_id seq_id = 0;
    common_sampler_ptr smpl(common_sampler_init(model_tgt, params.sampling));
    common_speculative * spec = common_speculative_init(params.speculative, 1);
    if (spec == nullptr) {
        fprintf(stderr, "llama.cpp refuses the draft for speculative decoding\n");
        return 3;
    }

    const int64_t t_start = ggml_time_us();
    dump.tokens("=prompt", prompt);
    {
        const int32_t * ids = llama_model_target_layer_ids(llama_get_model(ctx_dft));
        dump.tokens("=layer_ids", std::vector<llama_token>(ids, ids + llama_model_target_layer_ids_n(llama_get_model(ctx_dft))));
    }
    // the prefill as llama.cpp's server does it (its speculative-simple example starts from the prompt's last
    // token instead, drafting the first generated token too): the whole prompt through the target, the first
    // token sampled from its last logits, every prompt position's features to the speculative implementation
    dump.mark("#prefill");
    std::vector<llama_token> output;
    {
        common_batch batch_prompt(ctx_tgt);
        for (size_t i = 0; i < prompt.size(); ++i) {
            batch_prompt.add(prompt[i], (llama_pos) i, seq_id, i + 1 == prompt.size());
        }
        llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch_prompt.get());
        put_features(dump, ctx_tgt, llama_get_model(ctx_dft), (int32_t) prompt.size());
        dump.mark("#process");
        if (!common_speculative_process(spec, batch_prompt)) {
            fprintf(stderr, "llama.cpp's speculative prefill failed\n");
            return 1;
        }
    }
    llama_token id_last = common_sampler_sample(smpl.get(), ctx_tgt, -1);
    common_sampler_accept(smpl.get(), id_last, true);
    output.push_back(id_last);
    llama_tokens prompt_tgt(prompt.begin(), prompt.end());
    int n_past = (int) prompt.size();
    common_speculative_begin(spec, seq_id, prompt_tgt);
    bool stopped = false;
    for (auto s : stops) {
        stopped = stopped || id_last == s;
    }

    common_batch batch_tgt(ctx_tgt);
    llama_tokens draft;
    const int64_t t_decode = ggml_time_us();
    int n_steps = 0, n_accepted = 0;
    while (!stopped && (int) output.size() < max_new) {
        // γ = the tokens still to generate, at most: the last block shrinks as the reference's does
        int n_draft_max = std::min((int) llama_n_ctx(ctx_tgt) - n_past - 2, max_new - (int) output.size());
        n_draft_max = std::max(n_draft_max, 0);
        draft.clear();
        dump.mark("#draft");
        common_speculative_get_draft_params(spec, seq_id) = {true, n_draft_max, n_past, id_last, &prompt_tgt, &draft};
        common_speculative_draft(spec);
        llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, n_past, -1);
        dump.tokens("=draft", draft);

        dump.mark("#verify");
        batch_tgt.clear();
        batch_tgt.add(id_last, n_past++, seq_id, true);
        for (size_t i = 0; i < draft.size(); ++i) {
            batch_tgt.add(draft[i], n_past + (int) i, seq_id, true);
        }
        llama_process(ctx_tgt, LLAMA_PROCESS_TYPE_DECODE, batch_tgt.get());
        put_features(dump, ctx_tgt, llama_get_model(ctx_dft), (int32_t) draft.size() + 1);
        dump.mark("#process");
        if (!common_speculative_process(spec, batch_tgt)) {
            fprintf(stderr, "llama.cpp's speculative step failed\n");
            return 1;
        }
        auto ids = common_sampler_sample_and_accept_n(smpl.get(), ctx_tgt, draft);
        dump.tokens("=accepted", ids);
        n_steps += 1;
        n_accepted += (int) ids.size() - 1;
        common_speculative_accept(spec, seq_id, (uint16_t) (ids.size() - 1));
        n_past += (int) ids.size() - 1;
        for (size_t i = 0; i < ids.size() && !stopped && (int) output.size() < max_new; ++i) {
            prompt_tgt.push_back(id_last);
            id_last = ids[i];
            output.push_back(id_last);
            for (auto s : stops) {
                stopped = stopped || id_last == s;
            }
        }
        llama_memory_seq_rm(llama_get_memory(ctx_tgt), seq_id, n_past, -1);
        llama_memory_seq_rm(llama_get_memory(ctx_dft), seq_id, n_past, -1);
    }
    const int64_t t_end = ggml_time_us();
    dump.tokens("=output", output);
    if (dump.f) {
        fclose(dump.f);
    }
    // one line of JSON for bench engines: the output, the seconds of prefill and decoding, steps, accepted
    // proposals and this process's peak resident memory
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    printf("{\"output\": [");
    for (size_t i = 0; i < output.size(); ++i) {
        printf("%s%d", i ? ", " : "", output[i]);
    }
    printf("], \"prefill_s\": %.6f, \"decode_s\": %.6f, \"steps\": %d, \"accepted\": %d, \"peak_rss_mb\": %.1f}\n",
           (t_decode - t_start) / 1e6, (t_end - t_decode) / 1e6, n_steps, n_accepted, usage.ru_maxrss / 1024.0);
    common_speculative_free(spec);
    llama_backend_free();
    return 0;
}
