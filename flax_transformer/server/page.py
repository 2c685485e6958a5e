"""The HTTP server's web page at `/`: a text box, the language pair, a translate button, the
n-best when asked and the error line, in one self-contained HTML file (no external script or
style, so it works on a machine with no internet) that calls the server's own `/languages` and
`/translate` (LibreTranslate's shapes). A one-pair server's pair reads in names ("English →
German"). When /languages lists more than one pair (a many-language model), the pair becomes two
`<select>`s, source and target, set to the server's defaults (`render_page`) where it has them,
else to English and the browser's own language (`navigator.language`) where the model knows
them. The API-key field shows only on a server that needs a key. An error clears the previous
translation, and says what to do in the page's words, not the API's."""

from __future__ import annotations

import html

# The page, with {source}, {target}, {target_name} and {keys} where render_page puts them.
_TEMPLATE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>flax-transformer</title>
<style>
  body { font-family: system-ui, sans-serif; max-width: 46rem; margin: 2rem auto;
         padding: 0 1rem; color: #222; }
  textarea { width: 100%; box-sizing: border-box; font: inherit; padding: .5rem; }
  #translation { white-space: pre-wrap; min-height: 3rem; padding: .5rem;
                 background: #f4f4f4; }
  #error { color: #b00020; min-height: 1.2rem; }
  .row { display: flex; gap: 1rem; align-items: center; margin: .5rem 0; flex-wrap: wrap; }
  ol { margin: .25rem 0; }
  #nbest li { white-space: pre-wrap; }
</style>
</head>
<body data-source="{source}" data-target="{target}" data-target-name="{target_name}">
<h1>flax-transformer</h1>
<div class="row">
  <span id="pair">…</span>
  <span id="choice" hidden>
    <select id="source_lang" aria-label="source language"></select> &rarr;
    <select id="target_lang" aria-label="target language"></select>
  </span>
  <label>alternatives <input id="alternatives" type="number" min="0" value="0"
         style="width: 4rem"></label>
  <label id="key" {keys}>API key <input id="api_key" type="password" autocomplete="off"></label>
</div>
<textarea id="source" rows="5" placeholder="One sentence per line"></textarea>
<div class="row"><button id="translate" type="button">Translate</button>
  <span id="status"></span></div>
<div id="translation" aria-live="polite"></div>
<ol id="nbest"></ol>
<p id="error" role="alert"></p>
<script>
"use strict";
let source = null, target = null;
const names = {}, targets = {};  // A many-language server's: by code.
const $ = (id) => document.getElementById(id);

function option(select, code, name, chosen) {
  const item = document.createElement("option");
  item.value = code;
  item.textContent = name === code ? code : name + " (" + code + ")";
  item.selected = code === chosen;
  select.appendChild(item);
}

function fillTargets() {
  source = $("source_lang").value;
  const wanted = target || document.body.dataset.target;
  const codes = targets[source] || [];
  target = codes.includes(wanted) ? wanted : codes[0];
  $("target_lang").replaceChildren();
  for (const code of codes) option($("target_lang"), code, names[code] || code, target);
}

async function loadPair() {
  try {
    const languages = await (await fetch("/languages")).json();
    const pairs = languages.reduce((count, l) => count + l.targets.length, 0);
    if (pairs <= 1) {  // One pair: its names, as text.
      source = languages[0].code;
      target = languages[0].targets[0];
      const targetName = document.body.dataset.targetName || target;
      $("pair").textContent = languages[0].name + " \\u2192 " + targetName;
      return;
    }
    for (const l of languages) {
      names[l.code] = l.name;
      targets[l.code] = l.targets;
    }
    const wanted = document.body.dataset.source || named("English", languages[0].code);
    if (!document.body.dataset.target) target = named(browserLanguage(), null);
    for (const l of languages) option($("source_lang"), l.code, l.name, wanted);
    if (!targets[wanted]) $("source_lang").value = languages[0].code;
    fillTargets();
    $("pair").hidden = true;
    $("choice").hidden = false;
  } catch (error) {
    $("error").textContent = "Could not read /languages: " + error;
  }
}

// The first code named `name`, else `otherwise`.
function named(name, otherwise) {
  const code = Object.keys(names).find((code) => names[code] === name);
  return code === undefined ? otherwise : code;
}

// The English name of the browser's language ("German" for de-DE), or null.
function browserLanguage() {
  try {
    const base = (navigator.language || "").split("-")[0];
    return base ? new Intl.DisplayNames(["en"], {type: "language"}).of(base) : null;
  } catch (error) {
    return null;
  }
}

async function translate() {
  $("error").textContent = "";
  $("translation").textContent = "";
  $("nbest").replaceChildren();
  if (!$("source").value.trim()) {
    $("error").textContent = "Type a sentence to translate, one per line.";
    return;
  }
  $("status").textContent = "translating\\u2026";
  const body = {q: $("source").value, source: source, target: target, format: "text",
                alternatives: Number($("alternatives").value) || 0};
  if ($("api_key").value) body.api_key = $("api_key").value;
  try {
    const response = await fetch("/translate", {method: "POST",
        headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
    const answer = await response.json();
    if (!response.ok) {
      // The server's line, without the API's "Invalid request: " in front.
      const line = answer.error || ("HTTP " + response.status);
      $("error").textContent = line.replace(/^Invalid request: /, "");
      return;
    }
    $("translation").textContent = answer.translatedText;
    for (const alternative of answer.alternatives || []) {
      const item = document.createElement("li");
      item.textContent = alternative;
      $("nbest").appendChild(item);
    }
  } catch (error) {
    $("error").textContent = "The server did not answer: " + error;
  } finally {
    $("status").textContent = "";
  }
}

$("translate").addEventListener("click", translate);
$("source_lang").addEventListener("change", fillTargets);
$("target_lang").addEventListener("change", () => { target = $("target_lang").value; });
loadPair();
</script>
</body>
</html>
"""


def render_page(source_lang: str = "", target_lang: str = "", target_name: str = "",
                keys: bool = False) -> str:
  """The page, its language choice set to these codes where /languages lists them (a
  many-language server's defaults; '' for none); `target_name`, the one-pair target's name
  (/languages names sources only); `keys`: whether the server needs an API key."""
  return (_TEMPLATE.replace("{source}", html.escape(source_lang, quote=True))
          .replace("{target}", html.escape(target_lang, quote=True))
          .replace("{target_name}", html.escape(target_name, quote=True))
          .replace("{keys}", "" if keys else "hidden"))


__all__ = ["render_page"]
