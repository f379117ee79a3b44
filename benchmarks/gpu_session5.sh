#!/usr/bin/env bash
# Session 5 (2026-12-01) GPU steps. Usage (GPU machine, repo root, pydantic, black and
# pytest-xdist on PYTHONPATH): bash benchmarks/gpu_session5.sh OUT STEP
#   tests:    every generated test (4 workers: the time is mostly Triton compiling)
#   anchors:  issue 3's rows and 1000^3 against cuBLASLt, eager and torch.compile (bf16;
#             first-call tuning: the anchor specs' dims are dynamic, so no tables)
#   examples: the example specs at their own sizes (16 and 4096 rows, committed tables)
set -u
out=$1; step=$2
mkdir -p "$out"
case $step in
tests)
    timeout 500 python3 -m pytest generated -q -p no:cacheprovider -n 4 >"$out/tests.txt" 2>&1
    echo "tests exit $?" >>"$out/tests.txt"
    tail -3 "$out/tests.txt" ;;
anchors)
    timeout 560 python3 -m fusegen bench benchmarks/specs/anchors.yaml \
        --shapes 8192,4096,14336 4096,1024,4096 16,4096,14336 1000,1000,1000 16384,8192 \
        --compare cublaslt,eager,compile --out "$out/anchors" >"$out/anchors.txt" 2>"$out/anchors.log"
    echo "bench exit $?" >>"$out/anchors.txt"
    cat "$out/anchors.txt" ;;
examples)
    timeout 560 python3 -m fusegen bench specs --compare cublaslt,eager,compile \
        --out "$out/examples" >"$out/examples.txt" 2>"$out/examples.log"
    echo "bench exit $?" >>"$out/examples.txt"
    cat "$out/examples.txt" ;;
esac
# bert: re-tune bert_intermediate (its table held pointer entries only), bench it beside
# gpt2_mlp_up (same sizes, no inf/NaN check); masked_softmax's configs at 1000 columns.
case $step in
bert)
    timeout 200 python3 -m fusegen tune specs/bert.yaml --kernels bert_intermediate --rows 16,4096 >"$out/tune.txt" 2>&1
    echo "tune exit $?" >>"$out/tune.txt"
    cp generated/bert_intermediate.tuned.json "$out/"
    timeout 150 python3 -m fusegen bench specs/bert.yaml specs/gpt2.yaml --kernels bert_intermediate gpt2_mlp_up \
        --compare cublaslt,compile --out "$out/bert" >"$out/bert.txt" 2>"$out/bert.log"
    timeout 150 python3 benchmarks/row_configs.py specs/attention.yaml masked_softmax 131072,1000 >"$out/rows.txt" 2>&1
    grep -E "chose|exit|Error" "$out/tune.txt"; cut -c1-220 "$out/bert.txt"; cat "$out/rows.txt" ;;
esac
# retune: the two matmul tables a table-bound probe had kept on the pointer kernel
# (fixed in fusegen/tune.py), then the example specs' bench again.
case $step in
retune)
    timeout 300 python3 -m fusegen tune specs/bert.yaml specs/gpt2.yaml \
        --kernels bert_intermediate gpt2_attn_out --rows 16,4096 >"$out/tune.txt" 2>&1
    echo "tune exit $?" >>"$out/tune.txt"
    cp generated/bert_intermediate.tuned.json generated/gpt2_attn_out.tuned.json "$out/"
    timeout 200 python3 -m fusegen bench specs --compare cublaslt,eager,compile \
        --out "$out/examples" >"$out/examples.txt" 2>"$out/examples.log"
    echo "bench exit $?" >>"$out/examples.txt"
    grep -E "chose|exit|Error" "$out/tune.txt"; cut -c1-200 "$out/examples.txt" ;;
esac
# align: the row and elementwise kernels restate their row length and row strides as
# multiples of ALIGN (kernel source changed: their tables are re-tuned at the shapes
# they were tuned at), their generated tests, masked_softmax at 1000 columns, the rows.
case $step in
align)
    timeout 150 python3 -m fusegen tune specs/llama.yaml specs/bert.yaml \
        --kernels llama_add_rmsnorm bert_add_layernorm --rows 16,4096 >"$out/tune.txt" 2>&1
    timeout 60 python3 -m fusegen tune specs/attention.yaml --shapes 16384,2048 >>"$out/tune.txt" 2>&1
    timeout 60 python3 -m fusegen tune specs/elementwise.yaml --shapes 16384,8192 >>"$out/tune.txt" 2>&1
    echo "tune exit $?" >>"$out/tune.txt"
    cp generated/*.tuned.json "$out/"
    timeout 150 python3 -m pytest -q -n 4 -p no:cacheprovider generated/test_masked_softmax.py \
        generated/test_bias_gelu_residual.py generated/test_llama_add_rmsnorm.py \
        generated/test_bert_add_layernorm.py >"$out/tests.txt" 2>&1
    echo "tests exit $?" >>"$out/tests.txt"
    timeout 200 python3 -m fusegen bench specs/attention.yaml specs/elementwise.yaml benchmarks/specs/rows.yaml \
        --shapes 131072,1000 16384,8192 4096,1000 --compare eager,compile \
        --out "$out/rows" >"$out/rows.txt" 2>"$out/rows.log"
    echo "bench exit $?" >>"$out/rows.txt"
    grep -E "chose|exit|Error" "$out/tune.txt"; tail -2 "$out/tests.txt"; cut -c1-200 "$out/rows.txt" ;;
esac
# rowspace: the row space gained (1, 8192, 8), (2, 1024, 4) and three 4-warp configs:
# re-tune the row tables, bench LayerNorm, then the example specs once more.
case $step in
rowspace)
    timeout 100 python3 -m fusegen tune specs/llama.yaml specs/bert.yaml \
        --kernels llama_add_rmsnorm bert_add_layernorm --rows 16,4096 >"$out/tune.txt" 2>&1
    timeout 40 python3 -m fusegen tune specs/attention.yaml --shapes 16384,2048 >>"$out/tune.txt" 2>&1
    echo "tune exit $?" >>"$out/tune.txt"
    tar cf "$out/tables.tar" generated/*.tuned.json
    timeout 80 python3 -m fusegen bench benchmarks/specs/rows.yaml --kernels bench_layernorm \
        --shapes 16384,8192 131072,1000 --compare compile --out "$out/ln" >"$out/ln.txt" 2>&1
    timeout 150 python3 -m fusegen bench specs --compare cublaslt,eager,compile \
        --out "$out/examples" >"$out/examples.txt" 2>"$out/examples.log"
    echo "bench exit $?" >>"$out/examples.txt"
    tar cf "$out/logs.tar" "$out"/*.txt "$out/examples" "$out/ln"
    grep -E "chose|exit" "$out/tune.txt"; cut -c1-150 "$out/ln.txt" | grep -E "fusegen|compile"; cut -c1-200 "$out/examples.txt" ;;
esac
