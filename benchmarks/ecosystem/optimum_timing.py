"""Time 🤗 Optimum's `ORTModelForSeq2SeqLM` on a standard-layout folder; run by benchmarks/ecosystem_runtimes.py with
the interpreter of Optimum's own environment, never with this package's. Prints {NAME: {"seconds", "texts"}} as JSON.

    python optimum_timing.py REQUEST.json  # {"folder", "sentences", "threads", "rounds", "max_new_tokens", "runs"}
"""

import json
import sys
import time

import onnxruntime
import torch
from optimum.onnxruntime import ORTModelForSeq2SeqLM
from transformers import AutoTokenizer, GenerationConfig


def main(request_path: str) -> None:
    with open(request_path) as file:
        request = json.load(file)
    torch.set_num_threads(request["threads"])
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = request["threads"], 1
    model = ORTModelForSeq2SeqLM.from_pretrained(request["folder"], use_merged=True, session_options=options)
    tokenizer = AutoTokenizer.from_pretrained(request["folder"])
    sentences, config, results = request["sentences"], model.config, {}
    for name, run in request["runs"].items():
        model.generation_config = settings = GenerationConfig(
            num_beams=run["num_beams"], do_sample=False, max_new_tokens=request["max_new_tokens"], length_penalty=1.0,
            early_stopping=True, decoder_start_token_id=config.decoder_start_token_id, forced_eos_token_id=None,
            eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
        )  # fmt: skip
        results[name] = {"seconds": [], "texts": []}
        for _ in range(request["rounds"]):
            start, texts = time.perf_counter(), []
            for first in range(0, len(sentences), run["batch"]):
                batch = tokenizer(sentences[first : first + run["batch"]], return_tensors="pt", padding=True)
                outputs = model.generate(**batch, generation_config=settings)
                texts += tokenizer.batch_decode(outputs, skip_special_tokens=True)
            results[name] = {"seconds": [*results[name]["seconds"], time.perf_counter() - start], "texts": texts}
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
