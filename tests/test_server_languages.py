"""Language names for /languages and the page (`server.languages`), from langcodes (CLDR)."""

import pytest

pytest.importorskip("langcodes")

from flax_transformer.server.languages import language_name


@pytest.mark.parametrize("code, name", [
    ("de", "German"), ("de_DE", "German"), ("deu_Latn", "German"), ("af", "Afrikaans"),
    ("ast_Latn", "Asturian"), ("zho_Hant", "Chinese"), ("xx", "xx"), ("", ""),
    ("12_Latn", "12_Latn")])
def test_a_code_is_named_by_its_language_part_or_kept(code, name):
  assert language_name(code) == name


def test_every_code_of_nllb_and_m2m100_has_a_name():
  """The codes as Hugging Face's tokenizers list them (the page named 19 of M2M-100's 100 from
  a hand-written table); M2M-100's `ns` is no ISO 639 code."""
  nllb = pytest.importorskip("transformers.models.nllb.tokenization_nllb")
  from transformers.models.m2m_100 import tokenization_m2m_100 as m2m

  m2m_codes = m2m.FAIRSEQ_LANGUAGE_CODES
  m2m_codes = m2m_codes["m2m100"] if isinstance(m2m_codes, dict) else m2m_codes
  for codes, unnamed in ((nllb.FAIRSEQ_LANGUAGE_CODES, []), (m2m_codes, ["ns"])):
    assert [code for code in codes if language_name(code) == code] == unnamed
