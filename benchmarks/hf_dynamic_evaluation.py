"""Dynamic evaluation of a GPT-2-shaped Hugging Face model against a static pass over the same tokens, at the
thesis's segments of 32 after up to 992 tokens of context (6.3.2) and after 224; writes
benchmarks/results/hf_dynamic_evaluation.json.

    python benchmarks/hf_dynamic_evaluation.py          # moglm bench hf-dyneval; ~10 minutes on two cores
"""

from __future__ import annotations

from moglm.cli import main

if __name__ == "__main__":
    import sys

    sys.exit(main(["bench", "hf-dyneval", "--out", "benchmarks/results/hf_dynamic_evaluation.json", *sys.argv[1:]]))
