// Oracle for tests/data/quant/kquant_*.bin: runs ggml's own quantizers (llama.cpp's
// ggml/src/ggml-quants.c, compiled next to this file by scripts/gen_kquant_vectors.py with
// -O2 -ffp-contract=off -DNDEBUG) on rows read from stdin and writes the bytes to stdout.
//
// stdin:  u32 ggml type id, u32 n_rows, u32 n_per_row, u32 has_imatrix,
//         f32 src[n_rows * n_per_row], f32 imatrix[n_per_row] if has_imatrix
// stdout: the quantized rows, as ggml's quantize_<type>(src, dst, n_rows, n_per_row, imatrix)
//         writes them (what llama-quantize stores).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ggml.h"
#include "ggml-quants.h"

// ggml.c symbols ggml-quants.c links against; only these are reached.
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    fprintf(stderr, "ggml_abort %s:%d %s\n", file, line, fmt);
    abort();
}
static size_t block_size(enum ggml_type t) { return t == GGML_TYPE_Q4_0 || t == GGML_TYPE_Q4_1 || t == GGML_TYPE_Q5_0 || t == GGML_TYPE_Q5_1 || t == GGML_TYPE_Q8_0 || t == GGML_TYPE_IQ4_NL ? 32 : 256; }
size_t ggml_type_size(enum ggml_type t) {
    switch (t) {
        case GGML_TYPE_Q4_0: return 18; case GGML_TYPE_Q4_1: return 20; case GGML_TYPE_Q5_0: return 22;
        case GGML_TYPE_Q5_1: return 24; case GGML_TYPE_Q8_0: return 34; case GGML_TYPE_Q2_K: return 84;
        case GGML_TYPE_Q3_K: return 110; case GGML_TYPE_Q4_K: return 144; case GGML_TYPE_Q5_K: return 176;
        case GGML_TYPE_Q6_K: return 210; case GGML_TYPE_IQ4_NL: return 18; case GGML_TYPE_IQ4_XS: return 136;
        default: fprintf(stderr, "type %d unsupported\n", t); abort();
    }
}
size_t ggml_row_size(enum ggml_type t, int64_t ne) { return ggml_type_size(t) * (size_t)ne / block_size(t); }
const char * ggml_type_name(enum ggml_type t) { (void)t; return "?"; }

static void read_exact(void * p, size_t n) {
    if (fread(p, 1, n, stdin) != n) { fprintf(stderr, "short read\n"); exit(1); }
}

int main(void) {
    uint32_t hdr[4];
    read_exact(hdr, sizeof hdr);
    enum ggml_type t = (enum ggml_type)hdr[0];
    int64_t n_rows = hdr[1], n_per_row = hdr[2];
    float * src = malloc(sizeof(float) * n_rows * n_per_row);
    read_exact(src, sizeof(float) * n_rows * n_per_row);
    float * imatrix = NULL;
    if (hdr[3]) {
        imatrix = malloc(sizeof(float) * n_per_row);
        read_exact(imatrix, sizeof(float) * n_per_row);
    }
    size_t row_size = ggml_row_size(t, n_per_row);
    uint8_t * dst = calloc(n_rows, row_size);
    size_t n = 0;
    switch (t) {
        case GGML_TYPE_Q4_0: n = quantize_q4_0(src, dst, n_rows, n_per_row, imatrix); break;
        case GGML_TYPE_Q4_1: n = quantize_q4_1(src, dst, n_rows, n_per_row, imatrix); break;
        case GGML_TYPE_Q5_0: n = quantize_q5_0(src, dst, n_rows, n_per_row, imatrix); break;
        case GGML_TYPE_Q5_1: n = quantize_q5_1(src, dst, n_rows, n_per_row, imatrix); break;
        case GGML_TYPE_Q8_0: n = quantize_q8_0(src, dst, n_rows, n_per_row, imatrix); break;
        case GGML_TYPE_Q2_K: n = quantize_q2_K(src, dst, n_rows, n_per_row, imatrix); break;
        case GGML_TYPE_Q3_K: n = quantize_q3_K(src, dst, n_rows, n_per_row, imatrix); break;
        case GGML_TYPE_Q4_K: n = quantize_q4_K(src, dst, n_rows, n_per_row, imatrix); break;
        case GGML_TYPE_Q5_K: n = quantize_q5_K(src, dst, n_rows, n_per_row, imatrix); break;
        case GGML_TYPE_Q6_K: n = quantize_q6_K(src, dst, n_rows, n_per_row, imatrix); break;
        case GGML_TYPE_IQ4_NL: n = quantize_iq4_nl(src, dst, n_rows, n_per_row, imatrix); break;
        case GGML_TYPE_IQ4_XS: n = quantize_iq4_xs(src, dst, n_rows, n_per_row, imatrix); break;
        default: fprintf(stderr, "type %d unsupported\n", t); return 1;
    }
    if (n != n_rows * row_size) { fprintf(stderr, "size mismatch\n"); return 1; }
    fwrite(dst, 1, n, stdout);
    return 0;
}
