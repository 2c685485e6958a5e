"""Lexical constraints and forbidden phrases in beam search (`decoding.constraints`), on the
toy step functions of search_toys.py.

The references are independent float64 NumPy code written from the definitions in the
docstring of `decoding.constraints` (Post & Vilar's candidates, Hu et al.'s banks and rounds),
one hypothesis at a time in Python loops, and brute force over every sequence of a toy
vocabulary.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from flax_transformer import decoding
from flax_transformer.decoding import Ranking, SearchProblem, beam_search, constraints

from search_toys import EOS, PAD, HashToy, field_beam_search

P = 3  # Padded phrase length of the tests.


def _phrase_array(rows, pieces=P, count=None):
  """[[phrase, ...] per sentence] -> int32 [B, C, pieces], zero rows for none."""
  count = count or max(1, max(len(row) for row in rows))
  array = np.zeros((len(rows), count, pieces), np.int32)
  for b, row in enumerate(rows):
    for c, phrase in enumerate(row):
      array[b, c, :len(phrase)] = phrase
  return array


# ------------------------------------------------------------ the reference, from the definition
# Whole words in the toy vocabularies: tokens 3 and 5 continue the word before them (like a
# SentencePiece piece without "▁"); every other token starts one. PAD and EOS end a word.
CONTINUES = (False, False, False, True, False, True, False, False)


def _ends_with(seq, pieces):
  return len(pieces) <= len(seq) and tuple(seq[len(seq) - len(pieces):]) == tuple(pieces)


def _ends_word(token, cont):
  return cont is None or token in (PAD, EOS) or not cont[token]


def reference_state(seq, phrases, ordered, cont=None):
  """(met phrases, bank) of a hypothesis, replaying its tokens one at a time: phrase c is met
  at the token after an occurrence of it when that token ends the word (and c may be met)."""
  met = [False] * len(phrases)

  def may_meet():
    unmet = [c for c in range(len(phrases)) if not met[c]]
    return unmet[:1] if ordered else unmet

  for t in range(1, len(seq) + 1):
    for c in may_meet():  # Those that may be met at this step, decided before it.
      if _ends_with(seq[:t - 1], phrases[c]) and _ends_word(seq[t - 1], cont):
        met[c] = True
  progress = [max(m for m in range(len(phrases[c]) + 1) if _ends_with(seq, phrases[c][:m]))
              for c in may_meet()]
  return met, sum(len(p) for p, m in zip(phrases, met, strict=True) if m) + max(progress,
                                                                                default=0)


def reference_starts_inside_word(seq, token, row, phrases, ordered, cont, left):
  """Whether the candidate (seq, token) starts a phrase inside a word: token is the first piece
  of a phrase seq may meet and takes no phrase further (seq + token's longest progress over
  those phrases is 1), the model's best next token after seq (row: its log-probabilities, EOS
  included) continues seq's word, seq has no phrase pending (ends with a whole phrase it may
  meet), and seq has more positions left (left, this one included) than the pieces of its
  unmet phrases."""
  if cont is None:
    return False
  met, _ = reference_state(seq, phrases, ordered, cont)
  unmet = [c for c in range(len(phrases)) if not met[c]]
  may = unmet[:1] if ordered else unmet
  new = (*seq, token)
  progress = [max(m for m in range(len(phrases[c]) + 1) if _ends_with(new, phrases[c][:m]))
              for c in may]
  pending = any(_ends_with(seq, phrases[c]) for c in may)
  needed = sum(len(phrases[c]) for c in unmet)
  return (max(progress, default=0) == 1 and cont[int(np.argmax(row))] and not pending
          and left > needed)


def _divisor(n, alpha):
  return ((5.0 + n) / 6.0) ** alpha


def reference_holds(seq, phrases, ordered, cont=None):
  """Whether a whole output (EOS included, or cut) holds every phrase: its end ends a word."""
  return all(reference_state((*seq, PAD), phrases, ordered, cont)[0])


def reference_dba(log_probs, vocab, max_len, beams, alpha, phrases, ordered, max_tokens=None,
                  cont=None, stop="bound"):
  """Vectorized dynamic beam allocation, one hypothesis at a time in float64, with the stop
  rule of `decoding.constrained_beam` ("bound"; "k_finished" is fairseq's, for the mutation
  test). Returns [(score, seq)] best first, at most `beams`: hypotheses that hold every phrase
  first (finished, or cut at L), then by score, finished ones first among equals."""
  holds = lambda seq: reference_holds(seq, phrases, ordered, cont)
  alive, finished = [((), 0.0)], []
  for step in range(max_len):
    forced = max_tokens is not None and step >= max_tokens
    rows = {seq: log_probs(seq) for seq, _ in alive}
    candidates = {}  # (seq, token) -> summed log-probability
    if forced:
      for seq, total in alive:
        candidates[(seq, EOS)] = total + rows[seq][EOS]
    else:
      emittable = [(total + rows[seq][t], seq, t) for seq, total in alive
                   for t in range(vocab) if t not in (PAD, EOS)]
      for score, seq, t in sorted(emittable, key=lambda c: -c[0])[:beams]:  # (a)
        candidates[(seq, t)] = score
      for seq, total in alive:
        met, _ = reference_state(seq, phrases, ordered, cont)
        words = [t for t in range(vocab) if t not in (PAD, EOS)]
        best = max(words, key=lambda t: rows[seq][t])
        candidates[(seq, best)] = total + rows[seq][best]  # (c)
        starts = [t for t in words if _ends_word(t, cont)]
        unmet = [c for c in range(len(phrases)) if not met[c]]
        for c in unmet[:1] if ordered else unmet:  # (b)
          m = max(m for m in range(len(phrases[c]) + 1) if _ends_with(seq, phrases[c][:m]))
          following = (phrases[c][m] if m < len(phrases[c])
                       else max(starts, key=lambda t: rows[seq][t]))
          for t in (following, phrases[c][0]):
            candidates[(seq, t)] = total + rows[seq][t]
        if all(reference_state((*seq, EOS), phrases, ordered, cont)[0]):  # (d)
          candidates[(seq, EOS)] = total + rows[seq][EOS]
      left = min(max_len, max_len if max_tokens is None else max_tokens) - step
      candidates = {(seq, t): score for (seq, t), score in candidates.items()
                    if not reference_starts_inside_word(seq, t, rows[seq], phrases, ordered,
                                                        cont, left)}
    banks = {c: reference_state((*c[0], c[1]), phrases, ordered, cont)[1] for c in candidates}
    ranked = [c for c in sorted(candidates, key=lambda c: -candidates[c])
              if np.isfinite(candidates[c])]
    rank = {c: sum(1 for d in ranked[:ranked.index(c)] if banks[d] == banks[c]) for c in ranked}
    top = max(banks[c] for c in ranked) if ranked else 0
    rounds = sorted(ranked, key=lambda c: (rank[c], banks[c] != top))  # Then by score.
    for seq, t in rounds[:beams]:
      if t == EOS:
        finished.append((candidates[(seq, t)] / _divisor(len(seq) + 1, alpha), (*seq, EOS),
                         holds((*seq, EOS))))
    alive = [((*seq, t), candidates[(seq, t)]) for seq, t in rounds if t != EOS][:beams]
    kept = sorted(finished, key=lambda h: (not h[2], -h[0]))[:beams]
    if stop == "k_finished":
      done = len(finished) >= beams and step + 1 < max_len
    else:  # No alive beam can outrank the K-th of K finished that hold every phrase.
      n_max = max_len if max_tokens is None else min(max_tokens + 1, max_len)
      bound = (max(total for _, total in alive)
               / max(_divisor(step + 2, alpha), _divisor(n_max, alpha))) if alive else -np.inf
      done = len(kept) == beams and kept[-1][2] and bound <= kept[-1][0]
    if done:
      alive = []
      break
    if not alive:
      break
  ranked = [(not met, -s, 0, q, s) for s, q, met in finished] + [
      (not holds(seq), -total / _divisor(max_len, alpha), 1, seq, total / _divisor(max_len, alpha))
      for seq, total in alive]
  return [(h[4], h[3]) for h in sorted(ranked, key=lambda h: h[:3])][:beams]


def reference_constrained(log_probs, vocab, max_len, beams, alpha, phrases, ordered, cont=None,
                          stop="bound"):
  """The constrained search's answer: the plain beam search's (the field's rule, an independent
  reference of its own) where its best holds every phrase (those of its hypotheses that hold
  them, in order), otherwise dynamic beam allocation's."""
  plain = field_beam_search(log_probs, vocab, max_len, beams, alpha, "gnmt")
  if plain and reference_holds(plain[0][1], phrases, ordered, cont):
    return [(score, seq) for score, seq in plain if reference_holds(seq, phrases, ordered, cont)]
  return reference_dba(log_probs, vocab, max_len, beams, alpha, phrases, ordered, cont=cont,
                       stop=stop)


def _searched(toy, beams, phrases, ordered, alpha=0.6, cont=None, **limits):
  @jax.jit
  def run(phrases, limits):
    problem = SearchProblem(toy.step, toy.initial_state(), batch_size=toy.batch,
                            max_decode_len=toy.max_len, eos_id=EOS, constraints=phrases,
                            ordered_constraints=ordered,
                            word_continues=None if cont is None else jnp.asarray(cont[:toy.vocab]),
                            **limits)
    return beam_search(problem, beam_size=beams, ranking=Ranking(alpha))

  sequences, scores = run(jnp.asarray(_phrase_array(phrases)), limits)
  return np.asarray(sequences), np.asarray(scores)


def _hypotheses(sequences, scores, b):
  return [(float(s), tuple(int(t) for t in seq if t != PAD))
          for seq, s in zip(sequences[b], scores[b], strict=True) if np.isfinite(s)]


def _random_phrases(rng, batch, vocab, counts, cont=None):
  """Random phrases of 1 to P pieces; with `cont`, each starts a word."""
  starts = [t for t in range(2, vocab) if cont is None or not cont[t]]
  return [[(int(rng.choice(starts)),
            *(int(t) for t in rng.integers(2, vocab, size=rng.integers(0, P))))
           for _ in range(count)] for count in counts[:batch]]


# Each case compiles a search of its own (4-5 s on 2 cores): two stay in the fast tier, one of
# each order, and the whole suite runs all six.
@pytest.mark.parametrize("beams, ordered", [
    (3, False), (5, True),
    *(pytest.param(beams, ordered, marks=pytest.mark.slow)
      for beams, ordered in [(2, False), (2, True), (3, True), (5, False)])])
def test_beam_search_equals_the_numpy_reference_of_vectorized_dba(beams, ordered):
  rng = np.random.default_rng(beams + 10 * ordered)
  toy = HashToy(seed=70 + beams, batch=4, max_len=9, vocab=7, eos_logits=0.5)
  # Sentences with 0 to 3 phrases of 1 to 3 pieces (whole words), drawn at random.
  phrases = _random_phrases(rng, toy.batch, toy.vocab, [2, 0, 3, 1], CONTINUES)
  sequences, scores = _searched(toy, beams, phrases, ordered, cont=CONTINUES)
  for b in range(toy.batch):
    expected = reference_constrained(functools.partial(toy.log_probs, b), toy.vocab,
                                     toy.max_len, beams, 0.6, phrases[b], ordered, CONTINUES)
    got = _hypotheses(sequences, scores, b)
    assert [seq for _, seq in got] == [seq for _, seq in expected], (b, phrases[b])
    np.testing.assert_allclose([s for s, _ in got], [s for s, _ in expected], rtol=2e-6)


def _plain(toy, beams, alpha=0.6):
  problem = SearchProblem(toy.step, toy.initial_state(), batch_size=toy.batch,
                          max_decode_len=toy.max_len, eos_id=EOS)
  sequences, scores = jax.jit(lambda: beam_search(problem, beam_size=beams,
                                                  ranking=Ranking(alpha)))()
  return np.asarray(sequences), np.asarray(scores)


def _words(seq, cont):
  """The whole words of a toy output (EOS and padding dropped): [(start, pieces)]."""
  tokens = [int(t) for t in seq if t not in (PAD, EOS)]
  words = []
  for i, t in enumerate(tokens):
    if cont[t] and words:
      words[-1] = (words[-1][0], (*words[-1][1], t))
    else:
      words.append((i, (t,)))
  return [w for _, w in words if not cont[w[0]] and len(w) <= P]


@pytest.mark.parametrize("beams", [2, 3, 4, 5])
def test_a_translation_that_holds_its_terms_is_returned_unchanged(beams):
  """The translator's question: when the plain search's best output already holds every term
  as whole words, the constrained search returns exactly it, with its score. Terms are words
  of that output at its first, last and a middle position, one to three of them."""
  toy = HashToy(seed=200 + beams, batch=6, max_len=10, vocab=8, eos_logits=-2.0)
  sequences, scores = _plain(toy, beams)
  rng = np.random.default_rng(beams)
  cases = []
  for b in range(toy.batch):
    words = _words(sequences[b, 0], CONTINUES)
    where = [0, len(words) - 1, len(words) // 2] if words else []
    picked = sorted(set(where[:rng.integers(1, 4)]))  # In output order: ordered holds too.
    cases.append(list(dict.fromkeys(words[i] for i in picked)))
  assert sum(map(bool, cases)) >= toy.batch // 2, "most sentences get terms"
  for ordered in (False, True):
    phrases = cases
    constrained, constrained_scores = _searched(toy, beams, phrases, ordered, cont=CONTINUES)
    for b in range(toy.batch):
      np.testing.assert_array_equal(constrained[b, 0], sequences[b, 0], err_msg=str(phrases[b]))
      assert constrained_scores[b, 0] == scores[b, 0]


def test_the_stop_rule_is_what_the_reference_checks():
  """Mutation: the reference with fairseq's stop (K finished) disagrees with the search, so the
  reference tests can fail on the stop rule. Terms: the last word of each sentence's second
  plain hypothesis (its best does not hold it, so dynamic beam allocation searches)."""
  toy = HashToy(seed=313, batch=4, max_len=10, vocab=8, eos_logits=-1.0)
  plain, _ = _plain(toy, 3)
  phrases = [[(_words(plain[b, 1], CONTINUES) or [(2,)])[-1]] for b in range(toy.batch)]
  sequences, scores = _searched(toy, 3, phrases, False, cont=CONTINUES)
  differ = 0
  for b in range(toy.batch):
    log_probs = functools.partial(toy.log_probs, b)
    got = [seq for _, seq in _hypotheses(sequences, scores, b)]
    right = reference_constrained(log_probs, toy.vocab, toy.max_len, 3, 0.6, phrases[b],
                                  False, CONTINUES)
    wrong = reference_constrained(log_probs, toy.vocab, toy.max_len, 3, 0.6, phrases[b],
                                  False, CONTINUES, stop="k_finished")
    assert got == [seq for _, seq in right]
    differ += got != [seq for _, seq in wrong]
  assert differ >= 1


def test_the_reference_is_the_plain_top_k_rule_without_phrases():
  """Without phrases there is one bank: the reference with fairseq's stop is the field's rule
  (test of the test)."""
  toy = HashToy(seed=61, batch=2, max_len=7, vocab=6, eos_logits=1.0)
  for b in range(toy.batch):
    log_probs = functools.partial(toy.log_probs, b)
    assert ([seq for _, seq in reference_dba(log_probs, 6, 7, 3, 0.6, [], False,
                                             stop="k_finished")]
            == [tuple(seq) for _, seq in field_beam_search(log_probs, 6, 7, 3, 0.6, "gnmt")])


def _contains(seq, phrases, ordered):
  """Brute force's own test: every phrase occurs (ordered: ends strictly increasing)."""
  end = 0
  for phrase in phrases:
    ends = [i + len(phrase) for i in range(len(seq) - len(phrase) + 1)
            if tuple(seq[i:i + len(phrase)]) == tuple(phrase)
            and (not ordered or i + len(phrase) > end)]
    if not ends:
      return False
    end = ends[0]
  return True


# The fast tier keeps the ordered case (a search compile of 4-5 s each); the suite runs both.
@pytest.mark.parametrize("ordered", [pytest.param(False, marks=pytest.mark.slow), True])
def test_an_exhaustive_beam_finds_the_best_sequences_that_contain_every_phrase(ordered):
  # Two emittable tokens and L = 5: at most 16 alive beams and 48 candidates per step, so a
  # beam of 48 keeps every hypothesis and finishes every EOS.
  toy = HashToy(seed=80, batch=2, max_len=5, vocab=4, eos_logits=0.0)
  phrases = [[(3, 2), (2,)], [(2, 2), (3,)]]
  sequences, scores = _searched(toy, 48, phrases, ordered)
  for b in range(toy.batch):
    log_probs = functools.partial(toy.log_probs, b)
    expected = []
    for n in range(toy.max_len):
      for seq in itertools.product((2, 3), repeat=n):
        if _contains(seq, phrases[b], ordered):
          total = sum(log_probs(seq[:i])[t] for i, t in enumerate(seq)) + log_probs(seq)[EOS]
          expected.append((total / _divisor(n + 1, 0.6), (*seq, EOS)))
    expected.sort(key=lambda h: -h[0])
    finished = [h for h in _hypotheses(sequences, scores, b) if h[1][-1] == EOS]
    # Hypotheses cut at L may take some of the 48 places, never a better finished one's.
    assert len(finished) >= 3
    assert [seq for _, seq in finished] == [seq for _, seq in expected[:len(finished)]]
    np.testing.assert_allclose([s for s, _ in finished],
                               [s for s, _ in expected[:len(finished)]], rtol=2e-6)


def test_a_sentence_without_phrases_searches_as_it_would_alone():
  toy = HashToy(seed=90, batch=3, max_len=8, vocab=7, eos_logits=0.5)
  phrases = [[(4, 5)], [], [(6,), (2, 3)]]
  sequences, scores = _searched(toy, 4, phrases, False)
  plain = beam_search(SearchProblem(toy.step, toy.initial_state(), batch_size=toy.batch,
                                    max_decode_len=toy.max_len, eos_id=EOS),
                      beam_size=4, ranking=Ranking(0.6))
  np.testing.assert_array_equal(sequences[1], np.asarray(plain[0][1]))
  np.testing.assert_array_equal(scores[1], np.asarray(plain[1][1]))
  for b in (0, 2):  # The others: the best holds its phrases, as does each finished output (L
    # may cut the others: here sentence 0's four are all cut at L, the best holding its phrase).
    assert constraints.satisfied(sequences[b][0], phrases[b], False)
    finished = [seq for seq in sequences[b] if EOS in seq]
    assert all(constraints.satisfied(seq, phrases[b], False) for seq in finished)


def test_phrase_counts_and_lengths_are_data_of_one_program():
  toy = HashToy(seed=91, batch=2, max_len=8, vocab=7)
  traces = []

  @jax.jit
  def run(phrases):
    traces.append(1)
    problem = SearchProblem(toy.step, toy.initial_state(), batch_size=2, max_decode_len=8,
                            eos_id=EOS, constraints=phrases)
    return beam_search(problem, beam_size=3, ranking=Ranking(0.6))

  for rows in ([[(2,)], []], [[(3, 4, 5), (6,)], [(2, 2)]], [[], []]):
    run(jnp.asarray(_phrase_array(rows, P, count=2)))
  assert len(traces) == 1


def test_the_length_cap_forces_eos_before_the_phrases_are_met():
  toy = HashToy(seed=92, batch=2, max_len=8, vocab=7)
  phrases = [[(2, 3, 4), (5, 6)], [(4,)]]
  sequences, _ = _searched(toy, 3, phrases, False,
                           max_lengths=jnp.asarray([2, 6], jnp.int32))
  best = [tuple(int(t) for t in seq if t != PAD) for seq in sequences[:, 0]]
  assert len(best[0]) == 3 and best[0][-1] == EOS  # Two tokens, then the forced EOS.
  assert not constraints.satisfied(best[0], phrases[0], False)  # 5 pieces cannot fit in 2.
  assert constraints.satisfied(best[1], phrases[1], False)


@pytest.mark.parametrize("method", ["beam", "greedy", "sample"])
def test_forbidden_phrases_never_appear(method):
  toy = HashToy(seed=93, batch=4, max_len=9, vocab=6, eos_logits=-1.0)
  plain = SearchProblem(toy.step, toy.initial_state(), batch_size=toy.batch,
                        max_decode_len=toy.max_len, eos_id=EOS)

  def run(problem):
    if method == "beam":
      return beam_search(problem, beam_size=4, ranking=Ranking(0.6))[0]
    if method == "greedy":
      return decoding.greedy_search(problem)[0][:, None]
    return decoding.sample(problem, jax.random.key(0))[0][:, None]

  before = np.asarray(run(plain))
  # Forbid a bigram each sentence's best output holds, and one token of another.
  forbid = []
  for b in range(toy.batch):
    seq = [int(t) for t in before[b, 0] if t not in (PAD, EOS)]
    last = seq[-1] if seq else 4
    forbid.append([tuple(seq[:2]) if len(seq) >= 2 else (2, 3), (last,) if b == 3 else (5, 4)])
  after = np.asarray(run(plain.replace(forbid=jnp.asarray(_phrase_array(forbid)))))
  for b in range(toy.batch):
    for seq in after[b]:
      tokens = tuple(int(t) for t in seq if t != PAD)
      for phrase in forbid[b]:
        assert not any(tokens[i:i + len(phrase)] == phrase for i in range(len(tokens))), (
            b, tokens, phrase)
  assert not np.array_equal(before, after)


def test_forbidden_phrases_keep_the_model_scores():
  """A ban removes choices, not probability mass: scores are the model's log-probabilities."""
  toy = HashToy(seed=94, batch=2, max_len=6, vocab=6)
  forbid = jnp.asarray(_phrase_array([[(2,)], [(3, 4)]]))
  problem = SearchProblem(toy.step, toy.initial_state(), batch_size=2, max_decode_len=6,
                          eos_id=EOS, forbid=forbid)
  sequences, scores = decoding.greedy_search(problem)
  for b in range(2):
    seq = [int(t) for t in np.asarray(sequences[b]) if t != PAD]
    expected = sum(toy.log_probs(b, seq[:i])[t] for i, t in enumerate(seq))
    np.testing.assert_allclose(float(scores[b]), expected, rtol=1e-5)


def test_constraints_with_one_beam_greedy_or_every_beam_are_refused():
  toy = HashToy(seed=95, batch=1, max_len=5, vocab=6)
  problem = SearchProblem(toy.step, toy.initial_state(), batch_size=1, max_decode_len=5,
                          eos_id=EOS, constraints=jnp.asarray(_phrase_array([[(2,)]])))
  with pytest.raises(ValueError, match="beam_size >= 2"):
    beam_search(problem, beam_size=1)
  with pytest.raises(ValueError, match="finish_rule 'top_k'"):
    beam_search(problem, beam_size=2, ranking=Ranking(0.6, finish_rule="every_beam"))
  with pytest.raises(ValueError, match="greedy_search: constraints need beam search"):
    decoding.greedy_search(problem)
  with pytest.raises(ValueError, match="constraints must be int"):
    problem.replace(constraints=jnp.zeros((2, 1, 3), jnp.int32))


@pytest.mark.parametrize(("tokens", "phrases", "ordered", "expected"), [
    ((2, 3, 4, 1), [(3, 4), (2,)], False, True),
    ((2, 3, 4, 1), [(3, 4), (2,)], True, False),  # (2,) ends before (3, 4).
    ((2, 3, 4, 1), [(2, 3), (3, 4)], True, True),  # Overlapping occurrences, ends increasing.
    ((2, 2, 2, 3), [(2, 2, 3)], False, True),
    ((2, 3, 1, 0), [(3, 2)], False, False),
    ((5,), [], True, True),
])
def test_satisfied_follows_the_definition(tokens, phrases, ordered, expected):
  assert constraints.satisfied(tokens, phrases, ordered) == expected


@pytest.mark.parametrize(("tokens", "phrases", "ordered", "expected"), [
    ((2, 4, 1), [(2,)], False, True),  # 4 starts a word: "2" stands whole.
    ((2, 3, 1), [(2,)], False, False),  # 3 continues it: "2" is inside the word "2 3".
    ((2, 3, 1), [(2, 3)], False, True),
    ((2, 3), [(2, 3)], False, True),  # Cut at L: the end of the output ends the word.
    ((4, 2, 3, 2, 6, 1), [(2,)], False, True),  # The second occurrence stands whole.
    ((2, 6, 2, 3, 1), [(6,), (2,)], True, False),  # Ordered: "2" whole only before "6".
])
def test_satisfied_counts_whole_words_only(tokens, phrases, ordered, expected):
  assert constraints.satisfied(tokens, phrases, ordered, CONTINUES) == expected
  padded = np.zeros((1, 1, 8), np.int32)
  padded[0, 0, :len(tokens)] = tokens
  held = constraints.holds_every_phrase(jnp.asarray(padded), jnp.asarray(_phrase_array([phrases])),
                                        ordered, jnp.asarray(CONTINUES[:7]))
  assert bool(held[0, 0]) == expected


def _holds_word(seq, phrase, cont):
  """Brute force: the phrase occurs in the output followed by a token that ends the word."""
  tokens = [int(t) for t in seq if t != PAD]
  n = len(phrase)
  return any(tuple(tokens[i:i + n]) == tuple(phrase)
             and (i + n == len(tokens) or not cont[tokens[i + n]] or tokens[i + n] == EOS)
             for i in range(len(tokens) - n + 1))


@pytest.mark.parametrize("method", ["beam", "greedy", "sample"])
def test_forbidden_words_never_stand_whole_but_may_go_on(method):
  """Forbidding a word forbids it as a whole word only: the search lets it go on into a longer
  word (3 and 5 continue words) and leaves every hypothesis a legal token."""
  toy = HashToy(seed=96, batch=6, max_len=9, vocab=7, eos_logits=-1.0)
  cont = jnp.asarray(CONTINUES[:toy.vocab])
  plain = SearchProblem(toy.step, toy.initial_state(), batch_size=toy.batch,
                        max_decode_len=toy.max_len, eos_id=EOS, word_continues=cont,
                        max_lengths=jnp.asarray([8, 8, 3, 8, 2, 8], jnp.int32))

  def run(problem):
    if method == "beam":
      return [np.asarray(x) for x in beam_search(problem, beam_size=4, ranking=Ranking(0.6))]
    search = decoding.greedy_search if method == "greedy" else functools.partial(
        decoding.sample, rng=jax.random.key(0))
    sequences, scores = search(problem)
    return np.asarray(sequences)[:, None], np.asarray(scores)[:, None]

  before, _ = run(plain)
  # Each sentence's first whole word of its best output, forbidden.
  forbid = []
  for b in range(toy.batch):
    tokens = [int(t) for t in before[b, 0] if t not in (PAD, EOS)]
    first = tokens[:1] + list(itertools.takewhile(lambda t: CONTINUES[t], tokens[1:]))
    forbid.append([tuple(first[:P]) if first else (2,)])
  after, scores = run(plain.replace(forbid=jnp.asarray(_phrase_array(forbid))))
  went_on = 0
  for b in range(toy.batch):
    for seq, score in zip(after[b], scores[b], strict=True):
      if method == "beam" and not np.isfinite(score):
        continue
      assert np.isfinite(score), (b, seq)  # Never left without a legal token.
      assert not _holds_word(seq, forbid[b][0], CONTINUES), (b, seq, forbid[b])
      tokens, phrase = tuple(int(t) for t in seq), forbid[b][0]
      went_on += any(tokens[i:i + len(phrase)] == phrase for i in range(len(tokens)))
  assert not np.array_equal(before, after)
  # The pieces still occur where the word goes on: a ban of the pieces would have none.
  assert went_on >= 1
