"""`translate`, `score` and `evaluate`: each command's parser, what it runs
(`bulk.commands`), and what it says when a signal stops it."""

from __future__ import annotations

import argparse
import json
import os
import sys

from flax_transformer.cli import arguments
from flax_transformer.cli.arguments import add_command
from flax_transformer.errors import InputError


def run_translate(args: argparse.Namespace) -> int:
  """`translate`: a file or stdin to one translation (or --nbest) per line: a resumable file
  job, or a stream."""
  from flax_transformer.bulk import commands

  result = commands.translate(
      arguments.parameters(args), input=args.input, output=args.output,
      target_prefix=args.target_prefix, constraints=args.constraints, forbid=args.forbid,
      alignments=args.alignments, nbest=args.nbest,
      chunk_lines=args.chunk_lines, warmup=args.warmup, sharing=commands.Sharing(
          args.coordinator_address, args.num_processes, args.process_id))
  arguments.report_truncated("translate", result.truncated,
                             ", ".join(filter(None, (args.input, args.target_prefix))))
  arguments.report_unmet("translate", result.unmet, args.constraints)
  return 0


def run_score(args: argparse.Namespace) -> int:
  """`score`: log p(target | source) of each line pair of --src and --tgt (or with --metric
  metricx, MetricX-24's score of each translation)."""
  from flax_transformer.bulk import commands

  if args.metric == "metricx":
    return run_metricx(args)
  if args.ref is not None:
    raise InputError("--ref is for --metric metricx (MetricX-24 with references); --metric "
                     "logprob scores --tgt given --src alone.")
  result = commands.score(
      arguments.parameters(args), src=args.src, tgt=args.tgt, output=args.output,
      normalize=args.normalize, chunk_lines=args.chunk_lines,
      sharing=commands.Sharing(args.coordinator_address, args.num_processes, args.process_id))
  arguments.report_truncated("score", result.truncated, f"{args.src}, {args.tgt}")
  return 0


def run_metricx(args: argparse.Namespace) -> int:
  """`score --metric metricx`: MetricX-24's score of each line of --tgt for its --src (and
  --ref) line, with a MetricX workdir (`bulk.metricx`)."""
  from flax_transformer.bulk import commands, metricx

  if args.normalize:
    raise InputError("--normalize divides a log-probability by its tokens; --metric metricx "
                     "writes MetricX-24 scores (0 to 25): leave it out.")
  result = commands.score_metricx(
      arguments.parameters(args), src=args.src, tgt=args.tgt, ref=args.ref, output=args.output,
      chunk_lines=args.chunk_lines,
      sharing=commands.Sharing(args.coordinator_address, args.num_processes, args.process_id))
  if result.truncated:
    verb = "was" if result.truncated == 1 else "were"
    print(f"flax-transformer score: {arguments.lines(result.truncated)} {verb} longer than "
          f"MetricX's {metricx.MAX_TOKENS} tokens (its input text, EOS included) and {verb} cut "
          "to them, as metricx24 cuts them.", file=sys.stderr)
  return 0


def run_evaluate(args: argparse.Namespace) -> int:
  """`evaluate`: BLEU and chrF of a checkpoint's translations against references."""
  from flax_transformer.bulk import commands
  from flax_transformer.scoring import summary

  scores = commands.evaluate(arguments.parameters(args), src=args.src, ref=args.ref,
                             output=args.output, warmup=args.warmup,
                             target_lang=_moses_language(args.target_lang),
                             constraints=args.constraints,
                             forbid=args.forbid)
  arguments.report_truncated("evaluate", scores["truncated"], args.src)
  arguments.report_unmet("evaluate", scores.get("unmet", 0), args.constraints)
  if args.json:
    print(json.dumps(scores, indent=2))
  else:
    print(_measured(scores, args), summary(scores), sep="\n")
  return 0


def _measured(scores: dict, args: argparse.Namespace) -> str:
  """What `evaluate` scored, in one line: the checkpoint(s), the search, and what else shapes
  the translations: constraints and forbidden phrases, the precision, the vocabulary shortlist
  and the engine (as the scores name them, else as the flags do; a default left unsaid)."""
  from flax_transformer.config import TranslateConfig

  checkpoint = scores["checkpoint"]
  if isinstance(checkpoint, list):
    what = f"an ensemble of {len(checkpoint)} checkpoints ({', '.join(checkpoint)})"
  else:
    what = f"{checkpoint} (step {scores['step']})" if checkpoint else (
        f"step {scores['step']} of {args.workdir}")
  search = {"greedy": "greedy", "sample": "sampling"}.get(scores["method"])
  if search is None:
    search = (f"beam {scores['beam_size']}, length penalty {scores['length_penalty']:g} "
              f"({scores['length_normalization']}), finish rule {scores['finish_rule']}")
  given = lambda name: scores.get(name, getattr(args, name, None))
  parts = [what, search]
  if scores.get("constraints"):
    parts.append(f"constraints {scores['constraints']} ({scores['constraint_order']})")
  if scores.get("forbid"):
    parts.append(f"forbidding {scores['forbid']}")
  if given("precision") not in (None, "float32"):
    parts.append(given("precision"))
  if given("vocab_shortlist"):
    parts.append(f"shortlist {given('vocab_shortlist')}")
  default = TranslateConfig().engine
  engine = given("engine") or default
  group = given("slot_group") if engine == "slots" else 0
  if engine != default or group:
    parts.append(f"engine {engine}" + (f" (groups of {group})" if group else ""))
  return ", ".join(parts) + ":"


def _moses_language(code: str | None) -> str | None:
  """The two-letter language of a --target_lang code ("de", mBART's "de_DE") for BLEU on
  lc.norm.tok text; None for others (NLLB's "deu_Latn", M2M-100's three-letter codes)."""
  language = (code or "").split("_")[0]
  return language if len(language) == 2 else None


def kept_by_bulk_job(args: argparse.Namespace) -> str:
  """What a stopped `translate` or `score` leaves, the end of its stop line: its chunks in
  OUT.partial, which the same command resumes; a stream keeps nothing; a person typing at a
  terminal (standard input and output) keeps what was printed, and has nothing to rerun."""
  inputs = [args.input] if args.command == "translate" else [args.src, args.tgt]
  if inputs == ["-"] and args.output == "-" and sys.stdin.isatty():
    return "; the lines printed are whole"  # Typed in: Ctrl-C is how a person ends it.
  if "-" in inputs or args.output == "-":
    printed = "; the lines printed are whole" if args.output == "-" else ""
    return f"; a stream (input or output '-') cannot resume: rerun it{printed}"
  from flax_transformer.bulk import jobs

  if os.path.exists(args.output) and os.path.getmtime(args.output) >= args.started:
    return f" after writing {args.output}"
  try:
    kept = jobs.kept_chunks(args.output)
  except jobs.ResumeError:
    kept = None
  if kept is None:
    return " before any chunk was done; nothing was written"
  done, total = kept
  lines = jobs.kept_lines(args.output)  # Lines of unfinished chunks (the engine's slots).
  within = f" and {lines:,} more lines" if lines else ""
  return (f" after {done} of {total} chunk{'' if total == 1 else 's'}{within} (kept in "
          f"{jobs.partial_dir(args.output)}); the same command resumes")


def add_commands(commands) -> None:
  """The parsers of translate, score and evaluate, in the order `--help` lists them."""
  for add in (_add_translate, _add_score, _add_evaluate):
    add(commands)


def _add_translate(commands) -> None:
  """`translate`: a file or stdin translated line by line, a file job in resumable chunks."""
  translate = add_command(
      commands, "translate", "Translate a file (or stdin) line by line; a file job resumes.",
      "Translates a UTF-8 file (or standard input), one sentence a line, into one translation a "
      "line. A file job works in chunks kept in OUTPUT.partial/: stopped or killed, the same "
      "command resumes where it stopped, with the same result.",
      "flax-transformer translate --workdir workdirs/default --input test.src --output out.txt")
  translate.add_argument("--input", default="-", help="UTF-8 text, one sentence a line (default: "
                         "'-', standard input: each line typed or piped in comes back at once).")
  translate.add_argument("--output", default="-", help="Output file (gzip when it ends in .gz; "
                         "default: '-', standard output). A file job resumes; a stream does not.")
  arguments.add_checkpoint_arguments(translate, ensemble=True, resumes=True)
  arguments.section(translate, "phrases").add_argument(
      "--target_prefix", default=None, help="A file of line-aligned target prefixes that each "
      "translation starts with (an empty line: none).")
  arguments.add_phrase_arguments(translate)
  arguments.add_settings_arguments(translate)
  more = arguments.section(translate, "more_output")
  more.add_argument("--alignments", default=None, help="Also write each output line's word "
                    "alignment here, Moses 'i-j' (source word i, target word j, from 0).")
  more.add_argument("--nbest", type=int, default=None,
                    help="Write K hypotheses per line as 'i ||| hypothesis ||| score'.")
  arguments.add_bulk_arguments(translate)
  translate.set_defaults(run=run_translate, kept=kept_by_bulk_job)


def _add_score(commands) -> None:
  """`score`: each line pair's log p(target | source), or its MetricX-24 score."""
  score = add_command(
      commands, "score", "Write log p(target | source), or MetricX-24, of each line pair.",
      "Scores given translations: for each line pair of --src and --tgt, the model's log "
      "probability of the target (natural log, EOS included), one number a line; with --metric "
      "metricx and a MetricX-24 workdir, MetricX-24's score of the translation (0 best, 25 "
      "worst), with --ref or reference-free. Resumes as translate does.",
      "flax-transformer score --workdir workdirs/default --src test.src --tgt test.ref "
      "--output scores.txt")
  score.add_argument("--src", required=True, help="Source sentences, one a line.")
  score.add_argument("--tgt", required=True, help="Their translations, line-aligned.")
  score.add_argument("--output", default="-",
                     help="One score a line (default: '-', standard output).")
  score.add_argument("--metric", choices=("logprob", "metricx"), default="logprob",
                     help="logprob: the model's log p(target | source) (default); metricx: "
                     "MetricX-24's score of each translation, lower is better, with a workdir "
                     "that import-hf made of a MetricX-24 checkpoint.")
  score.add_argument("--ref", default=None, help="With --metric metricx: references, "
                     "line-aligned (MetricX-24's hybrid input); without them the score is "
                     "reference-free (quality estimation).")
  arguments.add_checkpoint_arguments(score, ensemble=True, resumes=True)
  arguments.add_settings_arguments(score, "batch_tokens", "precision", "source_lang",
                                   "target_lang")
  arguments.section(score, "more_output").add_argument(
      "--normalize", action="store_true", help="Divide by target tokens (+EOS).")
  arguments.add_bulk_arguments(score)
  score.set_defaults(run=run_score, kept=kept_by_bulk_job)


def _add_evaluate(commands) -> None:
  """`evaluate`: --src translated and scored against --ref (BLEU, chrF)."""
  evaluate = add_command(
      commands, "evaluate", "Translate --src and score it against --ref (BLEU, chrF).",
      "Measures a checkpoint: translates --src and prints BLEU and chrF against the references "
      "in --ref.",
      "flax-transformer evaluate --workdir workdirs/default --src test.src --ref test.ref")
  evaluate.add_argument("--src", required=True, help="Source sentences, one a line.")
  evaluate.add_argument("--ref", required=True, help="Reference translations, line-aligned.")
  evaluate.add_argument("--output", default=None, help="Also write the translations here.")
  arguments.add_checkpoint_arguments(evaluate, ensemble=True)
  arguments.add_phrase_arguments(evaluate)
  arguments.add_settings_arguments(evaluate)
  arguments.section(evaluate, "more_output").add_argument(
      "--json", action="store_true", help="Print the scores as JSON.")
  evaluate.set_defaults(run=run_evaluate, kept=lambda args: "; nothing was written: rerun it")
