"""The documentation site, built as CI builds it (sphinx-build -W), then read page by page: the
table of contents under its four captions, one API page per public package listing its
`__all__` with signatures and parameters, no duplicate or numbered headings, no "room" for a
package, and wide code blocks and tables kept inside the page at 1280 px (in headless Chromium,
where one is installed)."""

from __future__ import annotations

import html
import importlib
import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

bs4 = pytest.importorskip("bs4")
pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")

REPO = Path(__file__).resolve().parents[1]
CAPTIONS = ["Get started", "Guides", "Reference", "Contributing"]
# The public packages, each with its API page (docs/api/<page>.md).
PACKAGES = {
    "flax_transformer": "flax_transformer", "flax_transformer.model": "model",
    "flax_transformer.decoding": "decoding", "flax_transformer.training": "training",
    "flax_transformer.serving": "serving", "flax_transformer.bulk": "bulk",
    "flax_transformer.server": "server", "flax_transformer.interop": "interop",
    "flax_transformer.workdir": "workdir", "flax_transformer.data": "data",
    "flax_transformer.planning": "planning", "flax_transformer.runtime": "runtime",
}
# "room" as a name for a package; "room for N positions" (a cache's capacity) is English.
ROOM = re.compile(r"\brooms?\b(?! for)", re.I)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, str]:
  """(the built site's folder, the build's output): CI's command, warnings as errors."""
  out = tmp_path_factory.mktemp("docs_site")
  build = subprocess.run(
      [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", str(REPO / "docs"),
       str(out)], capture_output=True, text=True, cwd=REPO, timeout=900)
  assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-5000:]
  return out, build.stdout + build.stderr


def pages(out: Path) -> list[Path]:
  """The site's own pages (not search, index or module listings, nor the theme's files)."""
  skip = {"genindex.html", "search.html", "py-modindex.html"}
  return sorted(path for path in out.rglob("*.html")
                if path.name not in skip and not any(p.startswith("_") for p in
                                                     path.relative_to(out).parts))


def article(path: Path):
  return bs4.BeautifulSoup(path.read_text(), "html.parser").find("article")


def normalized(title: str) -> str:
  title = re.sub(r"[#¶]", "", title).strip().lower()
  return re.sub(r"^the\s+", "", title)


@pytest.mark.slow  # Builds the whole site (imports every package for its API pages): ~1 min.
def test_the_table_of_contents_has_its_four_captions_in_order(site):
  out, _ = site
  index = bs4.BeautifulSoup((out / "index.html").read_text(), "html.parser")
  body_captions = [c.get_text(strip=True) for c in index.find("article").select(".caption-text")]
  assert body_captions == CAPTIONS
  for path in pages(out):  # Every page's sidebar, too.
    sidebar = bs4.BeautifulSoup(path.read_text(), "html.parser").select_one(".bd-sidebar-primary")
    assert [c.get_text(strip=True) for c in sidebar.select(".caption-text")] == CAPTIONS, path


@pytest.mark.slow
def test_every_page_has_one_title_and_no_repeated_or_numbered_heading(site):
  out, _ = site
  checked = 0
  for path in pages(out):
    body = article(path)
    titles = [normalized(h.get_text()) for h in body.find_all("h1")]
    assert len(titles) == 1, (path, titles)
    headings = [normalized(h.get_text()) for h in body.find_all(["h1", "h2", "h3", "h4"])]
    assert not [h for h in headings if re.match(r"^\d+[.)]\s", h)], (path, headings)
    # A section may not repeat the page's title ("The Python API", then "Python API").
    assert titles[0] not in headings[1:], (path, headings)
    checked += 1
  assert checked >= 20


@pytest.mark.slow
def test_no_page_calls_a_package_a_room_or_shows_a_docstring_section_as_text(site):
  out, _ = site
  for path in pages(out):
    text = article(path).get_text(" ")
    assert not ROOM.search(text), (path, ROOM.search(text))
    # napoleon turns "Args:" and "Returns:" into field lists; left as text, a docstring broke.
    for paragraph in article(path).find_all("p"):
      assert not re.match(r"\s*(Args|Arguments|Returns|Raises):", paragraph.get_text()), (
          path, paragraph.get_text()[:200])


def _public(package: str) -> dict[str, object]:
  module = importlib.import_module(package)
  return {name: getattr(module, name) for name in module.__all__}


@pytest.mark.slow
@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_each_package_has_a_page_with_every_public_name_and_its_signature(site, package):
  out, _ = site
  page = out / "api" / f"{PACKAGES[package]}.html"
  soup = bs4.BeautifulSoup(page.read_text(), "html.parser")
  assert soup.find("h1").get_text(strip=True).rstrip("#") == package
  summary = {cell.get_text(strip=True) for cell in soup.select("table.autosummary td:first-child")}
  for name, value in _public(package).items():
    if isinstance(value, types.ModuleType):  # Listed with its summary line, in a table.
      assert name in summary or f"{package}.{name}" in summary, (package, name)
      continue
    entry = soup.find("dt", id=f"{package}.{name}")
    assert entry is not None, f"{package}.{name} has no entry on {page.name}"
    if callable(value) and not (isinstance(value, type) and issubclass(value, BaseException)):
      assert entry.select_one(".sig-paren"), f"{package}.{name} has no signature"


def _parameter_items(definition) -> list[tuple[str, str]]:
  """(name, description) of each parameter of one documented callable's "Parameters" field."""
  items = []
  fields = definition.find("dd", recursive=False).find("dl", class_="field-list", recursive=False)
  if fields is None:
    return items
  for label in fields.find_all("dt", recursive=False):
    if label.get_text(strip=True).rstrip(":") != "Parameters":
      continue
    body = label.find_next_sibling("dd")
    for paragraph in body.select("li > p") or body.find_all("p", recursive=False):
      name = paragraph.find("strong")
      if name is not None:
        items.append((name.get_text(strip=True), paragraph.get_text(" ", strip=True)))
  return items


@pytest.mark.slow
def test_every_parameter_is_its_own_item_not_text_inside_another(site):
  """"model_config: the architecture. params: its parameters" in a docstring's Args renders
  `params` as words inside model_config's description; each parameter must be its own item."""
  out, _ = site
  seen = 0
  for path in sorted((out / "api").glob("*.html")):
    soup = bs4.BeautifulSoup(path.read_text(), "html.parser")
    for definition in soup.select("dl.py.function, dl.py.method, dl.py.class"):
      signature = definition.find("dt")
      parameters = {re.split(r"[=:]", p.get_text(strip=True))[0].strip().lstrip("*")
                    for p in signature.select("em.sig-param")}
      parameters = {p for p in parameters if p.isidentifier()}
      for name, description in _parameter_items(definition):
        seen += 1
        name = name.lstrip("*")
        # "a, b: ..." documents two parameters as one item named "a, b".
        assert name in parameters or not parameters, (path.name, signature.get("id"), name)
        others = [p for p in parameters - {name}
                  if re.search(rf"(?<![\w.`]){re.escape(p)}: ", description)]
        assert not others, (path.name, signature.get("id"), name, others, description[:300])
  assert seen > 50  # The pages do render parameters as items.


@pytest.mark.slow
def test_the_build_log_gives_myst_one_short_line(site):
  _, log = site
  lines = [line for line in log.splitlines() if "myst v" in line]
  assert lines and all(len(line) < 200 for line in lines), lines


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
                    reason="no headless Chromium to lay the pages out")
def test_nothing_is_cut_off_at_1280_px(site, tmp_path):
  """Each page laid out by headless Chromium at 1280 px: no code block, table, signature or
  entry of the page's contents wider than the box it sits in (docs/_static/custom.css makes
  them wrap)."""
  out, _ = site
  chromium = shutil.which("chromium") or shutil.which("chromium-browser")
  script = """<script>window.addEventListener('load', () => {
    const wide = [];
    const note = (e, width, box) => wide.push(e.tagName + ' ' + Math.round(width) + '>' +
        Math.round(box) + ' ' + e.textContent.slice(0, 60).replace(/\\s+/g, ' '));
    // Wider than the box it sits in: code blocks, tables, signatures.
    document.querySelectorAll('article pre, article table, article dt.sig').forEach(e => {
      const box = e.parentElement.getBoundingClientRect().width;
      const width = Math.max(e.scrollWidth, e.getBoundingClientRect().width);
      if (width > box + 1) note(e, width, box);
    });
    // The page's contents, beside it: its long entries must wrap, not scroll it sideways.
    document.querySelectorAll('.bd-sidebar-secondary').forEach(e => {
      if (e.scrollWidth > e.clientWidth + 1) note(e, e.scrollWidth, e.clientWidth);
    });
    const d = document.createElement('div'); d.id = 'WIDE';
    d.textContent = 'measured;' + wide.join(' | '); document.body.appendChild(d);
  });</script>"""
  # One Chromium for the whole site: each page in a 1280 px frame of one probe page (a launch
  # per page took 40 s of CI). The frames are files beside it, readable with the flag below.
  frames = []
  for number, path in enumerate(pages(out)):
    probe = path.with_name(f"_probe_{path.name}")
    probe.write_text(path.read_text().replace("</body>", script + "</body>"))
    frames.append((number, path, probe))
  parent = out / "_probe_all.html"
  parent.write_text("".join(
      f'<iframe id="f{number}" src="{probe.as_uri()}" width="1280" height="2000"></iframe>'
      for number, _, probe in frames) + """<script>window.addEventListener('load', () => {
    const d = document.createElement('div'); d.id = 'ALL';
    d.textContent = JSON.stringify(Array.from(document.querySelectorAll('iframe'), f => {
      const wide = f.contentDocument && f.contentDocument.getElementById('WIDE');
      return wide ? wide.textContent : null; }));
    document.body.appendChild(d); });</script>""")
  dom = subprocess.run(
      [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1300,2000",
       "--allow-file-access-from-files", "--virtual-time-budget=20000", "--dump-dom",
       parent.as_uri()], capture_output=True, text=True, timeout=300).stdout
  found = re.search(r'<div id="ALL">([^<]*)</div>', dom)
  assert found, "Chromium did not lay out the probe page"
  measured = json.loads(html.unescape(found.group(1)))
  cut = {}
  for (_, path, _), wide in zip(frames, measured, strict=True):
    assert wide is not None and wide.startswith("measured;"), f"Chromium did not lay out {path}"
    if wide.removeprefix("measured;"):
      cut[str(path.relative_to(out))] = wide.removeprefix("measured;")[:500]
  assert not cut, cut
