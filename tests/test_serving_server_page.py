"""The web page at `/` in a real browser: Debian's headless Chromium (`apt-get install
chromium`) driven by Playwright with that executable (Playwright's own browser downloads are not
needed). The test types a sentence, presses Translate and reads the translation the page shows,
then the n-best, then the error line. It skips, saying why, where Chromium or Playwright is
missing."""

from __future__ import annotations

import shutil
import threading

import pytest

from flax_transformer.serving import Batcher, Service, Translator, http_server
from flax_transformer.serving.http_api import make_app

pytestmark = pytest.mark.slow  # Starts a browser; a trained workdir.

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def served(trained_workdir):
  """(the server's address, its translator): uvicorn in a thread on 127.0.0.1."""
  uvicorn = pytest.importorskip("uvicorn")
  translator = Translator.from_workdir(trained_workdir, batch_tokens=512)
  batcher = Batcher(translator)
  batcher.start()
  sock = http_server.listen("127.0.0.1", 0)
  server = uvicorn.Server(uvicorn.Config(make_app(batcher, Service("en", "de")),
                                         log_level="warning", lifespan="off"))
  thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{sock.getsockname()[1]}", translator
  server.should_exit = True
  thread.join(30)
  batcher.close(10)
  sock.close()


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium executable: apt-get install chromium")
def test_the_page_translates_what_is_typed(served):
  sync_api = pytest.importorskip("playwright.sync_api",
                                 reason="Playwright is not installed: pip install playwright")
  address, translator = served
  sentence = "the happy king does not swim"
  expected = translator.translate_nbest([sentence], 3)[0]
  with sync_api.sync_playwright() as playwright:
    browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                         args=["--no-sandbox", "--disable-gpu"])
    try:
      page = browser.new_page()
      page.goto(address)
      sync_api.expect(page.locator("#pair")).to_have_text("English → de")
      page.fill("#source", sentence)
      page.click("#translate")
      sync_api.expect(page.locator("#translation")).to_have_text(expected[0][0])
      assert page.text_content("#error") == ""

      page.fill("#alternatives", "2")
      page.click("#translate")
      texts = [text for text, _ in expected]
      others = [text for text in dict.fromkeys(texts[1:]) if text != texts[0]]
      sync_api.expect(page.locator("#nbest li")).to_have_text(others)

      page.fill("#source", "")
      page.click("#translate")
      sync_api.expect(page.locator("#error")).to_have_text(
          "Invalid request: missing q parameter")
    finally:
      browser.close()
