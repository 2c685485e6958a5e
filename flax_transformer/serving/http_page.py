"""The HTTP server's web page at `/`: a text box, the language pair, a translate button, the
n-best when asked and the error line, in one self-contained HTML file (no external script or
style, so it works on a machine with no internet) that calls the server's own `/languages` and
`/translate` (LibreTranslate's shapes)."""

from __future__ import annotations

PAGE = """<!doctype html>
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
</style>
</head>
<body>
<h1>flax-transformer</h1>
<div class="row">
  <span id="pair">…</span>
  <label>alternatives <input id="alternatives" type="number" min="0" value="0"
         style="width: 4rem"></label>
  <label>API key <input id="api_key" type="password" autocomplete="off"></label>
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
const $ = (id) => document.getElementById(id);

async function loadPair() {
  try {
    const languages = await (await fetch("/languages")).json();
    source = languages[0].code;
    target = languages[0].targets[0];
    $("pair").textContent = languages[0].name + " \\u2192 " + target;
  } catch (error) {
    $("error").textContent = "Could not read /languages: " + error;
  }
}

async function translate() {
  $("error").textContent = "";
  $("nbest").replaceChildren();
  $("status").textContent = "translating\\u2026";
  const body = {q: $("source").value, source: source, target: target, format: "text",
                alternatives: Number($("alternatives").value) || 0};
  if ($("api_key").value) body.api_key = $("api_key").value;
  try {
    const response = await fetch("/translate", {method: "POST",
        headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
    const answer = await response.json();
    if (!response.ok) {
      $("error").textContent = answer.error || ("HTTP " + response.status);
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
loadPair();
</script>
</body>
</html>
"""

__all__ = ["PAGE"]
