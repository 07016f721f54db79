// Prints llama.cpp's logits at every position of a prompt given as token ids, as JSON:
// {"model": PATH, "kv": "f16", "n_vocab": V, "logits": [[V floats] per position]}.
// An outside oracle for redline's forward pass (scripts/quality-q8-top1.py uses it on the
// fixtures' q8_0 files). Token ids go in as they are: no tokenizer, no BOS added.
//
// Build against a llama.cpp build tree (LLAMA = its source folder):
//   cc -O2 -o quality-llamacpp-logits scripts/quality-llamacpp-logits.c
//      -I$LLAMA/include -I$LLAMA/ggml/include -L$LLAMA/build/bin -lllama
//      -Wl,-rpath,$LLAMA/build/bin
// (one command line; scripts/quality-q8-top1.py builds it this way)
// Run: quality-llamacpp-logits MODEL.gguf f16|f32 ID,ID,... [nofa]
// (nofa: flash attention off. On the CPU, llama.cpp's flash attention rounds Q to f16 and
// accumulates V in f16 when K/V are f16, and gives the same logits with an f32 cache; with it
// off and an f32 cache, attention is plain f32.)

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char * text, void * user) {
    (void) user;
    if (level == GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s MODEL.gguf f16|f32 ID,ID,... [nofa]\n", argv[0]);
        return 2;
    }
    const char * path = argv[1];
    enum ggml_type kv = strcmp(argv[2], "f32") == 0 ? GGML_TYPE_F32 : GGML_TYPE_F16;

    int n_tokens = 0;
    llama_token tokens[4096];
    for (char * s = strtok(argv[3], ","); s != NULL; s = strtok(NULL, ",")) {
        if (n_tokens == 4096) {
            fprintf(stderr, "at most 4096 tokens\n");
            return 2;
        }
        tokens[n_tokens++] = (llama_token) atoi(s);
    }
    if (n_tokens == 0) {
        fprintf(stderr, "no tokens\n");
        return 2;
    }

    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model * model = llama_model_load_from_file(path, mp);
    if (model == NULL) {
        fprintf(stderr, "cannot load %s\n", path);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = 256;
    cp.n_ubatch = 256;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.type_k = kv;
    cp.type_v = kv;
    const int no_fa = argc == 5 && strcmp(argv[4], "nofa") == 0;
    if (no_fa) {
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (ctx == NULL) {
        fprintf(stderr, "cannot create a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    struct llama_batch batch = llama_batch_init(n_tokens, 0, 1);
    for (int i = 0; i < n_tokens; i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n_tokens;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "llama_decode failed\n");
        return 1;
    }

    printf("{\"model\": \"%s\", \"kv\": \"%s\", \"flash_attn\": %s, \"n_vocab\": %d, "
           "\"logits\": [", path, argv[2], no_fa ? "false" : "true", n_vocab);
    for (int i = 0; i < n_tokens; i++) {
        const float * row = llama_get_logits_ith(ctx, i);
        printf("%s[", i ? ",\n" : "\n");
        for (int j = 0; j < n_vocab; j++) {
            printf("%s%.9g", j ? "," : "", row[j]);
        }
        printf("]");
    }
    printf("]}\n");

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
