#!/usr/bin/env bash
# GPU steps behind issue 12's figures: strided layouts, tuned tables, first-call cost.
# Usage (GPU machine, repo root, pydantic, black and pytest-xdist on PYTHONPATH):
#   bash benchmarks/layouts_and_first_calls.sh OUT STEP [STEP ...]
#   check:     the generated tests of what changed in the kernels and launchers (the TMA
#              kernel's column-major operands, copies, fp32 precision, grad refusal)
#   retune:    the matmul modules' tuned tables (their kernel source changed), 16 and 4096 rows
#   space:     every config of the anchor GEMM chains at issue 3's shapes (`fusegen tune`'s
#              per-config log): what a first-call shortlist and default must find
#   layouts:   `fusegen bench --layout` on the OPT fc1 (x sliced) and tutorial-03 (b
#              transposed) chains, contiguous beside them; benchmarks/row_layouts.py
#   rows:      benchmarks/row_layouts.py alone (strided row and elementwise inputs)
#   tests:     every generated test
#   firstcall: each example kernel's first call in a fresh process, empty Triton cache, no
#              tuned table, at 16 and 4096 rows; the anchor chains at their shapes
#   defaults:  the anchor rows with the default (no tuning) and with first-call tuning
# Each step leaves OUT/STEP.txt and, where it writes more, OUT/STEP.tar.gz.
set -u
out=$1; shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
anchors="8192,4096,14336 4096,1024,4096 16,4096,14336 1000,1000,1000"
for step in "$@"; do
    log="$out/$step.txt"
    case $step in
    check)
        timeout 400 python3 -m pytest generated tests/test_import_styles.py -q -p no:cacheprovider -n 8 \
            -k "tma or column or stride or fp32 or grad or compile or import or pointer or graph" >"$log" 2>&1
        echo "check exit $?" >>"$log" ;;
    retune)
        timeout 500 python3 -m fusegen tune specs \
            --kernels gpt2_mlp_up gpt2_attn_out bert_intermediate llama_mlp_gate_up --rows 16,4096 >"$log" 2>&1
        echo "retune exit $?" >>"$log"
        tar czf "$out/retune.tar.gz" generated/*.tuned.json ;;
    space)
        python3 -m fusegen build benchmarks/specs --out "$out/anchor_modules" >/dev/null
        timeout 560 python3 -m fusegen tune benchmarks/specs/anchors.yaml --kernels anchor_gelu anchor_swiglu \
            --shapes $anchors --out "$out/anchor_modules" >"$log" 2>&1
        echo "space exit $?" >>"$log"
        tar czf "$out/space.tar.gz" "$out"/anchor_modules/*.tuned.json; rm -rf "$out/anchor_modules" ;;
    layouts)
        common=(--dtype fp16 --compare eager,compile,cublaslt --timer call)
        { timeout 150 python3 -m fusegen bench benchmarks/specs/layouts.yaml --kernels opt_fc1 --rows 4096 \
              "${common[@]}" --out "$out/layouts/opt_contiguous"
          timeout 150 python3 -m fusegen bench benchmarks/specs/layouts.yaml --kernels opt_fc1 --rows 4096 \
              --layout x=sliced "${common[@]}" --out "$out/layouts/opt_sliced"
          timeout 150 python3 -m fusegen bench benchmarks/specs/layouts.yaml --kernels tutorial_matmul \
              --shapes 4096,4096,4096 "${common[@]}" --out "$out/layouts/tutorial_contiguous"
          timeout 150 python3 -m fusegen bench benchmarks/specs/layouts.yaml --kernels tutorial_matmul \
              --shapes 4096,4096,4096 --layout b=transposed "${common[@]}" --out "$out/layouts/tutorial_transposed"
          timeout 200 python3 benchmarks/row_layouts.py
        } >"$log" 2>"$out/layouts.log"
        echo "layouts exit $?" >>"$log"
        tar czf "$out/layouts.tar.gz" "$out/layouts" "$out/layouts.log"; rm -rf "$out/layouts" ;;
    rows)
        timeout 200 python3 benchmarks/row_layouts.py >"$log" 2>&1
        echo "rows exit $?" >>"$log" ;;
    tests)
        timeout 560 python3 -m pytest generated tests/test_import_styles.py -q -p no:cacheprovider -n 8 >"$log" 2>&1
        echo "tests exit $?" >>"$log" ;;
    firstcall)
        { timeout 280 python3 benchmarks/first_call.py --no-table --rows 16,4096
          timeout 280 python3 benchmarks/first_call.py --spec benchmarks/specs/anchors.yaml \
              --kernels anchor_gelu anchor_swiglu --shapes $anchors
        } >"$log" 2>&1
        echo "firstcall exit $?" >>"$log" ;;
    defaults)
        for mode in default tuned; do
            setting=$([ $mode = default ] && echo 0 || echo 1)
            FUSEGEN_AUTOTUNE=$setting timeout 270 python3 -m fusegen bench benchmarks/specs/anchors.yaml \
                --kernels anchor_gelu anchor_swiglu --shapes $anchors --tables none --compare eager \
                --out "$out/defaults/$mode" >"$out/defaults_$mode.txt" 2>&1
            echo "$mode exit $?" >>"$out/defaults_$mode.txt"
        done
        cat "$out"/defaults_*.txt >"$log"
        tar czf "$out/defaults.tar.gz" "$out/defaults"; rm -rf "$out/defaults" "$out"/defaults_*.txt ;;
    esac
    tail -4 "$log"
done
