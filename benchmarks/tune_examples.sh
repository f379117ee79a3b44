#!/usr/bin/env bash
# Tune the example specs on this GPU and write generated/*.tuned.json (bf16; decode- and
# prefill-sized rows for the fixed-width kernels, one shape for the others). Prints the
# wall time of each kernel's tuning. Usage: bash benchmarks/tune_examples.sh [LOG_DIR]
set -u
log=${1:-tune-logs}
mkdir -p "$log"
started=$(date +%s)
budget=${TUNE_BUDGET_S:-520}
tune() {  # kernel, then fusegen tune's shape arguments
    local kernel=$1 s
    shift
    if (($(date +%s) - started > budget)); then
        echo "$kernel: skipped (over the ${budget} s budget)" | tee -a "$log/times.txt"
        return
    fi
    s=$(date +%s)
    python3 -m fusegen tune specs --kernels "$kernel" "$@" >>"$log/tune.txt" 2>"$log/$kernel.log"
    echo "$kernel: exit $?, $(($(date +%s) - s)) s" | tee -a "$log/times.txt"
}
tune gpt2_mlp_up --rows 16,4096
tune llama_mlp_gate_up --rows 16,4096
tune gpt2_attn_out --rows 16,4096
tune bert_intermediate --rows 16,4096
tune llama_add_rmsnorm --rows 16,4096
tune bert_add_layernorm --rows 16,4096
tune masked_softmax --shapes 16384,2048
tune bias_gelu_residual --shapes 16384,8192
