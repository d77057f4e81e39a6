/*
 * convert — Hugging Face checkpoints to GGUF. Prefix: hcv_.
 *
 * A checkpoint directory holds config.json (the architecture and its hyper-parameters), the weights
 * as safetensors (model.safetensors, or shards named by model.safetensors.index.json; F32, F16 or
 * BF16), tokenizer.json and tokenizer_config.json (special tokens, chat template). hcv_open reads
 * and checks all of it without touching the weights' bytes: every tensor the architecture needs is
 * there with the shape config.json implies, every tensor lies inside its file, and no tensor is
 * left unexplained. hcv_write then streams the weights tensor by tensor, a few MiB of rows at a
 * time, into a GGUF file with llama.cpp's metadata keys and tensor names — memory stays small
 * whatever the model's size — written under a temporary name and renamed when complete, so a
 * failure leaves no output file. Architectures: llama (LlamaForCausalLM, MistralForCausalLM),
 * qwen2, qwen3 (docs/convert.md).
 */
#ifndef HEARTH_CONVERT_H
#define HEARTH_CONVERT_H

#include "base/base.h"

#include <signal.h>

typedef struct hcv_model hcv_model;

/* Reads and checks the checkpoint in dir. NULL with the reason in err. */
hcv_model *hcv_open(const char *dir, hr_err *err);
void       hcv_free(hcv_model *m);

const char *hcv_arch(const hcv_model *m);          /* "llama", "qwen2", "qwen3" */
int64_t     hcv_n_tensors(const hcv_model *m);     /* tensors the GGUF will hold */
uint64_t    hcv_n_elements(const hcv_model *m);    /* weights, all tensors together */

/* bytes done of total, after each part written (may be NULL) */
typedef void (*hcv_progress_fn)(void *user, uint64_t done, uint64_t total);

typedef struct hcv_params {
    int             type;        /* 2-D weights: HQ_TYPE_F32, F16, BF16 or Q8_0; -1: BF16 where the
                                    checkpoint is BF16, else F16 (llama.cpp's "auto") */
    bool            overwrite;   /* replace an existing output file */
    hcv_progress_fn progress;
    void           *progress_user;
    const volatile sig_atomic_t *cancel; /* non-zero: stop within a few MiB (set by a signal handler); may be NULL */
} hcv_params;

/* Writes the GGUF to path. 0 or a negative HR_E* code with the reason in err (HR_EINVAL "cancelled"
   when *cancel was set); on failure no file is left at path, nor its temporary. */
int hcv_write(const hcv_model *m, const char *path, const hcv_params *p, hr_err *err);

#endif
