"""The web page at `/` in a real browser: Debian's headless Chromium (`apt-get install
chromium`) driven by Playwright with that executable (Playwright's own browser downloads are not
needed). The test types a sentence, presses Translate and reads the translation the page shows,
then the n-best, then the error line; on a server of a many-language model (tests/hf_fixture.py's
random NLLB-shaped one), it picks the pair in the page's two lists. It skips, saying why, where
Chromium or Playwright (or, for the second, torch) is missing."""

from __future__ import annotations

import contextlib
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from flax_transformer.server import Service, lifecycle
from flax_transformer.server.api import make_app
from flax_transformer.serving import Batcher, Translator

pytestmark = pytest.mark.slow  # Starts a browser; a trained workdir.

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.contextmanager
def _running(translator: Translator, service: Service) -> Iterator[str]:
  """The server's address while uvicorn serves `translator` in a thread on 127.0.0.1."""
  uvicorn = pytest.importorskip("uvicorn")
  batcher = Batcher(translator)
  batcher.start()
  sock = lifecycle.listen("127.0.0.1", 0)
  server = uvicorn.Server(uvicorn.Config(make_app(batcher, service), log_level="warning",
                                         lifespan="off"))
  thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
  thread.start()
  try:
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
  finally:
    server.should_exit = True
    thread.join(30)
    batcher.close(10)
    sock.close()


@pytest.fixture(scope="module")
def served(trained_workdir):
  """(the server's address, its translator)."""
  translator = Translator.from_workdir(trained_workdir, batch_tokens=512)
  with _running(translator, Service("en", "de")) as address:
    yield address, translator


@contextlib.contextmanager
def _browser_page(locale: str | None = None) -> Iterator[Any]:
  """A page of headless Chromium (Playwright with Debian's executable), in `locale`."""
  sync_api = pytest.importorskip("playwright.sync_api",
                                 reason="Playwright is not installed: pip install playwright")
  with sync_api.sync_playwright() as playwright:
    browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                         args=["--no-sandbox", "--disable-gpu"])
    try:
      yield browser.new_page(locale=locale)
    finally:
      browser.close()


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium executable: apt-get install chromium")
def test_the_page_translates_what_is_typed(served):
  sync_api = pytest.importorskip("playwright.sync_api",
                                 reason="Playwright is not installed: pip install playwright")
  address, translator = served
  sentence = "the happy king does not swim"
  expected = translator.translate_nbest([sentence], 3)[0]
  with _browser_page() as page:
    page.goto(address)
    sync_api.expect(page.locator("#pair")).to_have_text("English → German")
    assert page.locator("#choice").is_hidden()
    assert page.locator("#key").is_hidden()  # This server needs no API key.
    page.fill("#source", sentence)
    page.click("#translate")
    sync_api.expect(page.locator("#translation")).to_have_text(expected[0][0])
    assert page.text_content("#error") == ""

    page.fill("#alternatives", "2")
    page.click("#translate")
    texts = [text for text, _ in expected]
    others = [text for text in dict.fromkeys(texts[1:]) if text != texts[0]]
    sync_api.expect(page.locator("#nbest li")).to_have_text(others)
    # An alternative of a text of several lines keeps its lines.
    assert page.evaluate("getComputedStyle(document.querySelector('#nbest li')).whiteSpace"
                         ) == "pre-wrap"

    page.fill("#alternatives", "9")  # Over the beam: the server's line, in the page's words.
    page.click("#translate")
    sync_api.expect(page.locator("#error")).to_have_text(
        "alternatives parameter must be <= 3 (the server's beam size minus one)")
    assert page.text_content("#translation") == ""  # The previous translation is gone.
    page.fill("#source", "")
    page.click("#translate")
    sync_api.expect(page.locator("#error")).to_have_text(
        "Type a sentence to translate, one per line.")


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium executable: apt-get install chromium")
def test_the_page_of_a_many_language_server_picks_the_pair(tmp_path):
  """Two lists, set to the server's defaults; the target chosen is the one translated into
  (each answer the translator's for that pair alone); another source lists the others."""
  sync_api = pytest.importorskip("playwright.sync_api",
                                 reason="Playwright is not installed: pip install playwright")
  pytest.importorskip("torch", reason="needs torch (pip install -e '.[test]')")
  pytest.importorskip("transformers", reason="needs transformers")
  import hf_fixture

  from flax_transformer.interop import hf as hf_import

  hf_import.import_hf(hf_fixture.write_hf_model(tmp_path / "model", "nllb", train_steps=60),
                      tmp_path / "workdir")  # A few steps: the two targets translate apart.
  translator = Translator.from_workdir(tmp_path / "workdir", grow_cache="no", max_len_a=0.0,
                                       max_len_b=8, beam_size=2)
  source, german, french = hf_fixture.CODES["nllb"]
  sentence = "the happy king does not swim"
  alone = {target: translator.translate([sentence], source_lang=source, target_lang=target)[0]
           for target in (german, french)}
  assert alone[german] != alone[french]
  service = Service(source, french, languages=tuple(translator.languages))
  with _running(translator, service) as address, _browser_page() as page:
    page.goto(address)
    sync_api.expect(page.locator("#choice")).to_be_visible()
    assert page.locator("#pair").is_hidden()
    assert page.input_value("#source_lang") == source  # The server's defaults.
    assert page.input_value("#target_lang") == french
    assert page.locator("#target_lang option").all_text_contents() == [
        "German (deu_Latn)", "French (fra_Latn)"]
    page.fill("#source", sentence)
    for target in (german, french):
      page.select_option("#target_lang", target)
      page.click("#translate")
      sync_api.expect(page.locator("#translation")).to_have_text(alone[target])
    page.select_option("#source_lang", german)
    assert page.locator("#target_lang option").all_text_contents() == [
        "English (eng_Latn)", "French (fra_Latn)"]
    assert page.input_value("#target_lang") == french  # Kept where it still is a target.
  # No defaults: English, into the browser's own language where the model knows it.
  with (_running(translator, Service(None, None, languages=tuple(translator.languages)))
        as address, _browser_page(locale="fr-FR") as page):
    page.goto(address)
    sync_api.expect(page.locator("#choice")).to_be_visible()
    assert (page.input_value("#source_lang"), page.input_value("#target_lang")) == (
        source, french)
