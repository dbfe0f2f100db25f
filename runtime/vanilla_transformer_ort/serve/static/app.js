// vt-serve's web page: LibreTranslate's page in plain JavaScript. It talks to the server that sent it and to
// nothing else (relative URLs only; the server's Content-Security-Policy forbids any other origin).
"use strict";

const page = {
  settings: null,
  languages: [],
  timer: null,
  controller: null, // aborts the translation in flight when the text changes again
  sequence: 0,
};

const $ = (id) => document.getElementById(id);

function apiKey() {
  return localStorage.getItem("api_key") || "";
}

function showError(message) {
  $("error").textContent = message || "";
  $("error").hidden = !message;
}

function setStatus(element, state, message) {
  element.dataset.state = state;
  element.textContent = message || "";
}

// The server answers errors as {"error": "..."}: that line is what the reader sees.
async function call(path, options) {
  const response = await fetch(path, options);
  let body = null;
  try {
    body = await response.json();
  } catch (error) {
    throw new Error(`${path} answered ${response.status} without JSON`);
  }
  if (!response.ok) {
    throw new Error((body && body.error) || `${path} answered ${response.status}`);
  }
  return body;
}

function languageName(code) {
  const language = page.languages.find((l) => l.code === code);
  return language ? language.name : code;
}

function fillSelect(select, codes, wanted) {
  select.replaceChildren(...codes.map((code) => new Option(languageName(code), code)));
  if (codes.includes(wanted)) select.value = wanted;
}

function fillTargets(wanted) {
  const source = page.languages.find((l) => l.code === $("source").value);
  fillSelect($("target"), source ? source.targets : [], wanted);
  updateSwap();
}

// Swapping needs the reverse pair: the target must translate into the source.
function updateSwap() {
  const target = page.languages.find((l) => l.code === $("target").value);
  $("swap").disabled = !target || !target.targets.includes($("source").value);
}

function mirrorQuery() {
  const query = new URLSearchParams({ source: $("source").value, target: $("target").value });
  if ($("q").value) query.set("q", $("q").value);
  history.replaceState(null, "", `${location.pathname}?${query}`);
}

function updateCount() {
  const limit = page.settings.charLimit;
  const length = $("q").value.length;
  $("count").textContent = limit >= 0 ? `${length} / ${limit}` : `${length}`;
}

function updateKeyNotice() {
  $("key-notice").hidden = !(page.settings.keyRequired && !apiKey());
}

function onInput() {
  updateCount();
  mirrorQuery();
  clearTimeout(page.timer);
  // An answer for an older text must not land after this one: drop the request in flight.
  if (page.controller) page.controller.abort();
  page.sequence++;
  if (!$("q").value) {
    $("translation").value = "";
    setStatus($("status"), "idle");
    return;
  }
  setStatus($("status"), "pending", "…");
  page.timer = setTimeout(translate, page.settings.frontendTimeout);
}

async function translate() {
  if (page.controller) page.controller.abort();
  const controller = new AbortController();
  page.controller = controller;
  const sequence = ++page.sequence;
  const form = new FormData();
  form.append("q", $("q").value);
  form.append("source", $("source").value);
  form.append("target", $("target").value);
  form.append("format", "text");
  form.append("api_key", apiKey());
  setStatus($("status"), "translating", "Translating…");
  try {
    const answer = await call("translate", { method: "POST", body: form, signal: controller.signal });
    if (sequence !== page.sequence) return;
    $("translation").value = answer.translatedText;
    showError("");
    setStatus($("status"), "done");
  } catch (error) {
    if (error.name === "AbortError" || sequence !== page.sequence) return;
    showError(error.message);
    setStatus($("status"), "error", "Not translated");
  }
}

function translateNow() {
  clearTimeout(page.timer);
  if ($("q").value) translate();
}

function swap() {
  const source = $("source").value;
  const target = $("target").value;
  $("source").value = target;
  fillTargets(source);
  $("q").value = $("translation").value;
  $("translation").value = "";
  onInput();
}

function askForKey() {
  const key = window.prompt("Your API key (the server's operator hands them out):", apiKey());
  if (key === null) return;
  localStorage.setItem("api_key", key.trim());
  updateKeyNotice();
  showError("");
  translateNow();
}

function selectTab(name) {
  const text = name === "text";
  $("tab-text").setAttribute("aria-selected", String(text));
  $("tab-files").setAttribute("aria-selected", String(!text));
  $("text-panel").hidden = !text;
  $("files-panel").hidden = text;
}

async function translateFile() {
  const file = $("file").files[0];
  const status = $("file-status");
  $("download").hidden = true;
  if (!file) {
    showError("Choose a file first.");
    return;
  }
  const form = new FormData();
  form.append("file", file);
  form.append("source", $("source").value);
  form.append("target", $("target").value);
  form.append("api_key", apiKey());
  setStatus(status, "translating", "Translating…");
  $("translate-file").disabled = true;
  try {
    const answer = await call("translate_file", { method: "POST", body: form });
    const link = $("download");
    link.href = answer.translatedFileUrl;
    link.textContent = `Download ${decodeURIComponent(answer.translatedFileUrl.split("/").pop()).replace(/^[0-9a-f]{32}\./, "")}`;
    link.hidden = false;
    showError("");
    setStatus(status, "done", "Translated");
    link.click();
  } catch (error) {
    showError(error.message);
    setStatus(status, "error", "Not translated");
  } finally {
    $("translate-file").disabled = false;
  }
}

async function start() {
  try {
    const [settings, languages] = await Promise.all([call("frontend/settings"), call("languages")]);
    page.settings = settings;
    page.languages = languages;
  } catch (error) {
    showError(`Cannot load the server's settings: ${error.message}`);
    setStatus($("status"), "error");
    return;
  }
  const query = new URLSearchParams(location.search);
  const sources = page.languages.filter((l) => l.targets.length > 0).map((l) => l.code);
  fillSelect($("source"), sources, query.get("source") || page.settings.language.source.code);
  fillTargets(query.get("target") || page.settings.language.target.code);

  if (page.settings.charLimit >= 0) $("q").maxLength = page.settings.charLimit;
  $("api-key").hidden = !page.settings.apiKeys;
  updateKeyNotice();
  if (page.settings.filesTranslation) {
    $("tab-files").hidden = false;
    $("formats").textContent = page.settings.supportedFilesFormat.join(", ");
    $("file").accept = page.settings.supportedFilesFormat.join(",");
  }

  $("q").addEventListener("input", onInput);
  $("source").addEventListener("change", () => {
    fillTargets($("target").value);
    mirrorQuery();
    translateNow();
  });
  $("target").addEventListener("change", () => {
    updateSwap();
    mirrorQuery();
    translateNow();
  });
  $("swap").addEventListener("click", swap);
  $("api-key").addEventListener("click", askForKey);
  $("tab-text").addEventListener("click", () => selectTab("text"));
  $("tab-files").addEventListener("click", () => selectTab("files"));
  $("translate-file").addEventListener("click", translateFile);

  setStatus($("status"), "idle");
  const text = query.get("q");
  if (text) {
    $("q").value = text.slice(0, $("q").maxLength >= 0 ? $("q").maxLength : undefined);
    onInput();
  } else {
    updateCount();
  }
}

document.addEventListener("DOMContentLoaded", start);
