// Time transformers.js in Node on a standard-layout folder; run by benchmarks/ecosystem_runtimes.py from a copy
// placed beside the pinned installation's node_modules (tests/js/npm_cache.py), where Node resolves the import.
//
//   node transformers_js_timing.mjs REQUEST.json      // prints one JSON line: {NAME: {seconds, texts} | {error}}
//
// REQUEST: {"folder", "sentences", "threads", "rounds", "max_new_tokens", "runs": {NAME: {"batch", "num_beams"}}}.

import { readFileSync } from "node:fs";
import path from "node:path";

import { env, pipeline } from "@huggingface/transformers";

const request = JSON.parse(readFileSync(process.argv[2], "utf8"));
const folder = path.resolve(request.folder);
env.allowRemoteModels = false;
env.allowLocalModels = true;
env.useBrowserCache = false;
env.localModelPath = path.dirname(folder) + path.sep;

const translator = await pipeline("translation", path.basename(folder), {
  dtype: "fp32",
  device: "cpu",
  local_files_only: true,
  session_options: { intraOpNumThreads: request.threads, interOpNumThreads: 1 },
});
const results = {};
for (const [name, run] of Object.entries(request.runs)) {
  if (run.num_beams > 1) {
    // generate() in transformers.js 4.x keeps one sequence per input whatever num_beams says (its own "TODO:
    // Support beam search"): timing it would label greedy decoding as beam search.
    results[name] = { error: "no beam search in transformers.js generate()" };
    continue;
  }
  try {
    const seconds = [];
    let texts = [];
    for (let round = 0; round < request.rounds; round++) {
      texts = [];
      const start = performance.now();
      for (let first = 0; first < request.sentences.length; first += run.batch) {
        const batch = request.sentences.slice(first, first + run.batch);
        const outputs = await translator(batch, {
          max_new_tokens: request.max_new_tokens,
          num_beams: run.num_beams,
          do_sample: false,
          length_penalty: 1.0,
        });
        texts.push(...outputs.map((output) => output.translation_text));
      }
      seconds.push((performance.now() - start) / 1000);
    }
    results[name] = { seconds, texts };
  } catch (error) {
    results[name] = { error: String(error.message || error).split("\n")[0] };
  }
}
process.stdout.write(JSON.stringify(results) + "\n");
