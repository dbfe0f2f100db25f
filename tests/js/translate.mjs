// Translate stdin's lines with transformers.js in Node, from an export in the standard (Optimum) layout.
//
//   node translate.mjs MODEL_DIR [--dtype fp32|q8] [--max_new_tokens N] < sentences.txt
//
// Prints a JSON array with one translation per input line. Only local files are read: remote models are off,
// and the folder is found through env.localModelPath. Decoding is greedy (num_beams 1, no sampling) with an
// explicit max_new_tokens, so that another runtime given the same settings must produce the same text.
// fp32 reads onnx/{encoder_model,decoder_model_merged}.onnx, q8 their *_quantized.onnx siblings.

import { existsSync, readFileSync } from "node:fs";
import path from "node:path";

import { env, pipeline } from "@huggingface/transformers";

const USAGE = "usage: node translate.mjs MODEL_DIR [--dtype fp32|q8] [--max_new_tokens N] < sentences";
const DTYPES = ["fp32", "q8"];

function fail(message) {
  process.stderr.write(`translate.mjs: ${message}\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const options = { modelDir: null, dtype: "fp32", maxNewTokens: 64 };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === "--dtype") {
      options.dtype = argv[++i];
    } else if (arg === "--max_new_tokens") {
      options.maxNewTokens = Number(argv[++i]);
    } else if (arg.startsWith("--")) {
      fail(`unknown option ${arg}\n${USAGE}`);
    } else if (options.modelDir === null) {
      options.modelDir = arg;
    } else {
      fail(`unexpected argument ${arg}\n${USAGE}`);
    }
  }
  if (options.modelDir === null) fail(USAGE);
  if (!DTYPES.includes(options.dtype)) fail(`--dtype must be one of ${DTYPES.join(", ")}, got ${options.dtype}`);
  if (!Number.isInteger(options.maxNewTokens) || options.maxNewTokens < 1) {
    fail(`--max_new_tokens must be a positive integer`);
  }
  return options;
}

const options = parseArgs(process.argv.slice(2));
const modelDir = path.resolve(options.modelDir);
if (!existsSync(path.join(modelDir, "config.json"))) fail(`${modelDir} has no config.json`);
const modelId = path.basename(modelDir);
// transformers.js looks a model up below localModelPath only when its id looks like a Hub id.
if (!/^[\w.-]{1,96}$/.test(modelId) || modelId.includes("..") || modelId.includes("--")) {
  fail(`rename ${modelDir}: transformers.js needs a folder name of letters, digits, "_", "." and single "-"`);
}

env.allowRemoteModels = false;
env.allowLocalModels = true;
env.useBrowserCache = false;
// A model id is a path below localModelPath: the folder's parent, then its name.
env.localModelPath = path.dirname(modelDir) + path.sep;

const sentences = readFileSync(0, "utf8")
  .split("\n")
  .filter((line) => line.length > 0);

const translator = await pipeline("translation", modelId, {
  dtype: options.dtype,
  device: "cpu",
  local_files_only: true,
});
const outputs = [];
// One sentence per call: no padding, so each translation depends only on its own sentence.
for (const sentence of sentences) {
  const [result] = await translator(sentence, {
    max_new_tokens: options.maxNewTokens,
    num_beams: 1,
    do_sample: false,
  });
  outputs.push(result.translation_text);
}
await translator.dispose();
process.stdout.write(JSON.stringify(outputs) + "\n");
