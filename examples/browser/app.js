// Translate what the user types with transformers.js, entirely from files on the page's own server.
//
// The server (serve.py, or any static server laid out the same way) provides:
//   vendor/transformers.min.js                     transformers.js's browser bundle (onnxruntime-web inside)
//   vendor/ort-wasm-simd-threaded.asyncify.{mjs,wasm}  onnxruntime-web's WebAssembly runtime
//   models.json                                    [{"id": "NAME", "dtypes": ["fp32", "q8"]}, ...]
//   models/NAME/...                                an export in the standard layout (config.json, tokenizer.json,
//                                                  onnx/encoder_model.onnx, onnx/decoder_model_merged.onnx, ...)
// Decoding is greedy (num_beams 1, no sampling), one sentence at a time, so a translation does not depend on the
// other lines.

import { env, pipeline } from "./vendor/transformers.min.js";

const here = (path) => new URL(path, document.baseURI).href;

env.allowRemoteModels = false; // never the Hugging Face Hub
env.allowLocalModels = true;
// A path, not a full URL: transformers.js treats a full URL as a remote file.
env.localModelPath = new URL("models/", document.baseURI).pathname;
env.useBrowserCache = false; // a re-exported folder is read afresh on reload
// Without this, transformers.js would fetch onnxruntime-web's WebAssembly files from a CDN.
env.backends.onnx.wasm.wasmPaths = {
  mjs: here("vendor/ort-wasm-simd-threaded.asyncify.mjs"),
  wasm: here("vendor/ort-wasm-simd-threaded.asyncify.wasm"),
};

const DTYPE_LABELS = { fp32: "fp32", q8: "int8 (q8)" };
const elements = Object.fromEntries(
  ["model", "dtype", "max-new-tokens", "translate", "source", "output", "status"].map((id) => [
    id,
    document.getElementById(id),
  ]),
);
const translators = new Map(); // "model|dtype" -> pipeline promise
let models = [];

function setStatus(state, text) {
  elements.status.dataset.state = state;
  elements.status.className = state === "error" ? "error" : "";
  elements.status.textContent = text;
}

function fillDtypes() {
  const model = models.find((m) => m.id === elements.model.value);
  elements.dtype.replaceChildren(
    ...model.dtypes.map((dtype) => new Option(DTYPE_LABELS[dtype] ?? dtype, dtype)),
  );
}

function translatorFor(model, dtype) {
  const key = `${model}|${dtype}`;
  if (!translators.has(key)) {
    // device "wasm": onnxruntime-web's CPU backend, the same kernels in every browser.
    translators.set(key, pipeline("translation", model, { dtype, device: "wasm", local_files_only: true }));
  }
  return translators.get(key);
}

async function translate() {
  const model = elements.model.value;
  const dtype = elements.dtype.value;
  const maxNewTokens = Number(elements["max-new-tokens"].value);
  const sentences = elements.source.value.split("\n").filter((line) => line.trim().length > 0);
  elements.translate.disabled = true;
  elements.output.replaceChildren();
  try {
    setStatus("loading", `Loading ${model} (${dtype})…`);
    const translator = await translatorFor(model, dtype);
    setStatus("translating", `Translating ${sentences.length} sentence(s)…`);
    const start = performance.now();
    for (const sentence of sentences) {
      const [result] = await translator(sentence, { max_new_tokens: maxNewTokens, num_beams: 1, do_sample: false });
      const item = document.createElement("li");
      item.textContent = result.translation_text;
      elements.output.append(item);
    }
    const seconds = ((performance.now() - start) / 1000).toFixed(2);
    setStatus("done", `Translated ${sentences.length} sentence(s) in ${seconds} s with ${model} (${dtype}).`);
  } catch (error) {
    translators.delete(`${model}|${dtype}`);
    setStatus("error", `Error: ${error.message ?? error}`);
    console.error(error);
  } finally {
    elements.translate.disabled = false;
  }
}

async function start() {
  const response = await fetch(here("models.json"));
  if (!response.ok) throw new Error(`models.json: HTTP ${response.status}`);
  models = await response.json();
  if (models.length === 0) throw new Error("models.json lists no model");
  elements.model.replaceChildren(...models.map((m) => new Option(m.id, m.id)));
  elements.model.addEventListener("change", fillDtypes);
  fillDtypes();
  elements.translate.addEventListener("click", translate);
  elements.translate.disabled = false;
  setStatus("ready", "Ready: type sentences on the left, one per line, then Translate.");
}

start().catch((error) => setStatus("error", `Error: ${error.message ?? error}`));
