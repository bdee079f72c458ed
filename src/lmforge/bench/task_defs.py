"""The twelve ACBench tasks (see :mod:`lmforge.bench.tasks` for the interface and prompt formats)."""

from __future__ import annotations

import json
import logging
import random
import re
from dataclasses import asdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmforge.bench.tasks import (
    Context,
    EpisodicTask,
    Item,
    SingleTurnTask,
    bucket_name,
    read_jsonl,
    register,
    render_messages,
    require,
)
from lmforge.common.errors import UserError
from lmforge.common.io import atomic_write_text

# --------------------------------------------------------------------------------------------------
# Workflow: WorfBench


class WorfBenchTask(SingleTurnTask):
    name = "worfbench"
    capability = "workflow"
    primary = "node_f1"
    files = ("worfbench.json",)
    description = "WorfBench workflow graphs: node F1 (LIS over topological orders) and graph F1"

    def generate(self, folder: Path, seed: int, n: int) -> None:
        from lmforge.eval import worfbench

        if not self.paths(folder):
            worfbench.write(worfbench.generate(seed, n), folder / self.files[0])

    def items(self, path: Path, ctx: Context) -> list[Item]:
        from lmforge.data import workflow
        from lmforge.eval import worfbench

        records = worfbench.load(path)
        demos = worfbench.demonstrations(ctx.seed, ctx.shots, {r.task for r in records}) if ctx.shots else []
        out = []
        for it in records:
            if ctx.scoring == "official" and workflow.parse_graph_official(it.gold_text) is None:
                raise UserError(f"{path}: record {it.id!r}: WorfBench's reader finds no edge in the gold plan")
            if ctx.fmt == "zoo":
                prompt = workflow.prompt({"task": it.task})
            else:
                # The worked examples go between the system turn and the record's own user turn.
                head = [m for m in it.messages if m["role"] == "system"]
                rest = [m for m in it.messages if m["role"] != "system"]
                prompt = render_messages(ctx.tokenizer, head + demos + rest, ctx.fmt)
            # NOTE: the zoo's plan ends at a blank line, which the stop cuts at. WorfBench cuts nothing
            # (and its own prompt shows blank lines), so other formats run to EOS or the token cap:
            # WorfBench allows 1024 new tokens, here 512 (as T-Eval), 192 for the zoo's short plans.
            zoo = ctx.fmt == "zoo"
            out.append(Item(
                id=it.id, prompt=prompt, reference=workflow.render_plan(it.gold_nodes, it.gold_edges),
                max_new_tokens=192 if zoo else 512, stop=("\n\n",) if zoo else (),
                gold=(it.gold_nodes, it.gold_edges, it.gold_text), meta={"source": it.source},
            ))
        return out

    def score(self, item: Item, response: str, ctx: Context) -> dict[str, float]:
        from lmforge.data import workflow
        from lmforge.eval.metrics import graph_f1, node_f1, official_graph_f1, official_node_f1, trigram_embed

        embed = ctx.embed or trigram_embed
        gold_nodes, gold_edges = item.gold[0], item.gold[1]
        if ctx.scoring == "lmforge":
            nodes, edges = workflow.parse_plan(response)
            return {
                "node_f1": node_f1(nodes, gold_nodes, gold_edges, embed=embed)["f1"],
                "graph_f1": graph_f1(nodes, edges, gold_nodes, gold_edges, embed=embed)["f1"],
            }
        # Official (WorfBench's node_eval.py): both plans through its reader; a prediction it gets no
        # graph from (no "Node", or no edge) is skipped there while the mean still divides by every
        # record, i.e. it scores 0.
        gold = workflow.parse_graph_official(item.gold[2] if len(item.gold) > 2 else workflow.render_plan(gold_nodes, gold_edges))
        pred = workflow.parse_graph_official(response)
        if pred is None or gold is None:
            return {"node_f1": 0.0, "graph_f1": 0.0}
        return {
            "node_f1": official_node_f1(pred[0], gold[0], gold[1], embed=embed)["f1"],
            "graph_f1": official_graph_f1(pred[0], pred[1], gold[0], gold[1], embed=embed)["f1"],
        }


# --------------------------------------------------------------------------------------------------
# Long context: NIAH, LongBench QA and retrieval

_CODE_Q = re.compile(r"code for (\w+)\?")

# NOTE: KVCache-Factory's NIAH prompt, paraphrased to one user turn (its exact wording varies by model
# template); the scoring, 10 x ROUGE-1 F against the needle, is the original's.
NIAH_INSTRUCTION = "Don't give information outside the document or repeat your findings."


class NiahTask(SingleTurnTask):
    name = "niah"
    capability = "long_context"
    primary = "score"
    files = ("niah.json",)
    scale = 10.0
    description = "Needle in a haystack: 10 x ROUGE-1 F of the answer against the needle, per length x depth"

    def generate(self, folder: Path, seed: int, n: int) -> None:
        """Settings for the zoo's contexts: its key-value needle and lengths up to 1024 tokens.

        NOTE: the original needle is a San Francisco sentence; the built-in grid uses the zoo's own
        needle form ("KEY DDDD."), the only one lmforge's tiny models were trained to retrieve. A
        settings file with the original needle runs unchanged.
        """
        from lmforge.data.needle import KEYS, needle_sentence
        from lmforge.eval.niah import NiahSettings, depth_grid

        rng = random.Random(seed)
        key = rng.choice(KEYS)
        value = "".join(rng.choice("0123456789") for _ in range(4))
        lengths = [128, 256, 512, 1024]
        depths = depth_grid(max(2, min(11, n // len(lengths))))
        s = NiahSettings(context_lengths=lengths, depth_percents=depths, needle=needle_sentence(key, value),
                         question=f"What is the code for {key}?", reserve_tokens=32)
        if not self.paths(folder):
            atomic_write_text(folder / self.files[0], json.dumps(asdict(s), indent=2) + "\n")

    # The real profile's grid: the original needle and haystack at 1k-8k tokens (SmolLM2's 8k context;
    # lengths past a model's positions are skipped when the items are built).
    REAL_LENGTHS = (1000, 2000, 4000, 8000)

    def generate_for(self, folder: Path, seed: int, n: int, profile: str) -> None:
        """``zoo``: :meth:`generate`. ``real``: the original test, the San Francisco needle and question
        in the Paul Graham haystack, ``n`` cells over :attr:`REAL_LENGTHS` x a depth grid, with the
        original's 200-token reserve for the question and answer."""
        if profile != "real":
            return self.generate(folder, seed, n)
        from lmforge.eval.niah import NEEDLE, QUESTION, NiahSettings, depth_grid

        lengths = list(self.REAL_LENGTHS)
        s = NiahSettings(context_lengths=lengths, depth_percents=depth_grid(max(2, min(11, n // len(lengths)))),
                         needle=NEEDLE, question=QUESTION, haystack="paul_graham", reserve_tokens=200)
        if not self.paths(folder):
            atomic_write_text(folder / self.files[0], json.dumps(asdict(s), indent=2) + "\n")

    def items(self, path: Path, ctx: Context) -> list[Item]:
        from lmforge.eval.niah import build_context, haystack_text, load_settings

        s = load_settings(path)
        lengths = [n for n in s.context_lengths if ctx.max_positions is None or n <= ctx.max_positions]
        if not lengths:
            raise UserError(f"{path}: every NIAH context length exceeds the model's {ctx.max_positions} positions")
        if len(lengths) < len(s.context_lengths):
            logging.getLogger(__name__).warning(
                "NIAH: skipping context lengths %s, beyond the model's %d positions",
                [n for n in s.context_lengths if n not in lengths], ctx.max_positions)
        # Enough haystack for the longest context (generous: ~3 characters a token).
        hay = haystack_text(s, 6 * max(lengths), seed=ctx.seed)
        key = _CODE_Q.search(s.question)
        prefix = key.group(1) if (ctx.fmt == "zoo" and key) else ""
        out = []
        for n in lengths:
            for d in s.depth_percents:
                context = build_context(ctx.tokenizer, hay, n, d, s.needle, reserve=s.reserve_tokens)
                if ctx.fmt == "zoo":
                    prompt = f"{context}\nQuestion: {s.question}\nAnswer: {prefix}".rstrip()
                    reference = s.needle[len(prefix):].rstrip(".") if prefix and s.needle.startswith(prefix) else " " + s.needle
                else:
                    msg = f"{context}\n\nQuestion: {s.question} {NIAH_INSTRUCTION}\nAnswer:"
                    prompt = render_messages(ctx.tokenizer, [{"role": "user", "content": msg}], ctx.fmt)
                    reference = " " + s.needle
                out.append(Item(
                    id=f"len{n}_depth{d}", prompt=prompt, reference=reference,
                    max_new_tokens=8 if prefix else 64, stop=("\n",), gold=(s.needle, prefix),
                    meta={"length": n, "depth": d},
                ))
        return out

    def score(self, item: Item, response: str, ctx: Context) -> dict[str, float]:
        from lmforge.eval.longctx import niah_score

        needle, prefix = item.gold
        # NOTE: where the zoo prompt already holds the answer's opening (the key), the response is
        # scored against the rest of the needle, what the model had to retrieve; crediting the
        # forced opening would give every answer half marks.
        target = needle[len(prefix):] if prefix and needle.startswith(prefix) else needle
        return {"score": niah_score(target, response.strip())}


# NOTE: LongBench's single-document QA prompt (multifieldqa_en), used for both built-in tasks; LongBench
# has no key-value retrieval set of its own (the retrieval miniature is RULER-style), so a user's real
# retrieval file (e.g. passage_retrieval_en) is prompted with this QA template, not LongBench's own.
LONGBENCH_PROMPT = (
    "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question "
    "based on the above text, only give me the answer and do not output any other words.\n\n"
    "Question: {input}\nAnswer:"
)


class _LongBenchTask(SingleTurnTask):
    capability = "long_context"
    n_needles = 1
    metric = ""

    def generate(self, folder: Path, seed: int, n: int) -> None:
        """LongBench records over the zoo's key-value haystacks (LongBench fields, plus
        ``answer_prefix``: the answer's opening that the zoo prompt format puts in the prompt).

        NOTE: LongBench's documents cannot be downloaded here; the built-in records are key-value
        retrieval in the zoo's filler text, 16-100 sentences (about 130-850 tokens, inside agent-small's 1024).
        """
        from lmforge.data import needle

        rng = random.Random(seed)
        lines = []
        for i in range(n):
            rec = needle.example(rng, n_sentences=rng.randint(16, 100), n_needles=self.n_needles)
            lines.append(json.dumps({
                "input": rec["question"], "context": rec["context"], "answers": [rec["answer"]],
                "length": len(rec["context"].split()), "dataset": self.name, "language": "en",
                "all_classes": None, "_id": f"{self.name}_{i}", "answer_prefix": needle.answer_prefix(rec["key"]),
            }))
        if not self.paths(folder):
            atomic_write_text(folder / self.files[0], "\n".join(lines) + "\n")

    def items(self, path: Path, ctx: Context) -> list[Item]:
        out = []
        for where, rec in read_jsonl(path, "LongBench"):
            require(rec, where, input=str, context=str, answers=list)
            if not rec["answers"] or not all(isinstance(a, str) for a in rec["answers"]):
                raise UserError(f"{where}: 'answers' must be a non-empty list of strings")
            length = rec.get("length")
            if not isinstance(length, int):
                length = len(rec["context"].split())
            prefix = str(rec.get("answer_prefix") or "") if ctx.fmt == "zoo" else ""
            if ctx.fmt == "zoo":
                prompt = f"{rec['context']}\nQuestion: {rec['input']}\nAnswer: {prefix}".rstrip()
            else:
                msg = LONGBENCH_PROMPT.format(context=rec["context"], input=rec["input"])
                prompt = render_messages(ctx.tokenizer, [{"role": "user", "content": msg}], ctx.fmt)
            out.append(Item(
                id=str(rec.get("_id", where)), prompt=prompt, reference=" " + rec["answers"][0],
                max_new_tokens=8 if ctx.fmt == "zoo" else 32, stop=("\n",), gold=rec["answers"],
                meta={"length": length, "bucket": bucket_name(length, ctx.length_buckets)},
            ))
        return out

    def score(self, item: Item, response: str, ctx: Context) -> dict[str, float]:
        from lmforge.eval.longctx import qa_f1, retrieval_em

        answer = response.strip().split("\n", 1)[0]
        fn = qa_f1 if self.metric == "f1" else retrieval_em
        return {self.metric: fn(answer, item.gold)}


class LongBenchQATask(_LongBenchTask):
    name = "longbench_qa"
    primary = metric = "f1"
    files = ("longbench_qa.jsonl",)
    description = "LongBench-style single-document QA: token F1 of the answer, by length bucket"


class LongBenchRetrievalTask(_LongBenchTask):
    name = "longbench_retrieval"
    primary = metric = "em"
    files = ("longbench_retrieval.jsonl",)
    n_needles = 4
    description = "LongBench-style retrieval among several keys: exact match, by length bucket"


for _t in (WorfBenchTask(), NiahTask(), LongBenchQATask(), LongBenchRetrievalTask()):
    register(_t)


# --------------------------------------------------------------------------------------------------
# Real world: AgentBoard-style environments


class _AgentBoardTask(EpisodicTask):
    capability = "real_world"
    primary = "progress_rate"
    env = ""

    def generate(self, folder: Path, seed: int, n: int) -> None:
        from lmforge.eval import agentboard

        if not self.paths(folder):
            agentboard.write(agentboard.generate(self.env, seed, n), folder / self.files[0])

    def load(self, path: Path, ctx: Context) -> list[Any]:
        from lmforge.eval import agentboard

        problems = [p for p in agentboard.load(path) if p.env == self.env]
        if not problems:
            raise UserError(f"{path}: no {self.env} problems")
        return problems

    def rollout(self, policy: Callable[[list[str]], list[str]], records: list[Any], ctx: Context) -> list[dict[str, Any]]:
        from lmforge.eval import agentboard

        if ctx.fmt == "chat":
            policy = self._chat_policy(policy, ctx)
        # NOTE: in the zoo and plain formats observations go to the model as they are: the
        # environments speak the zoo's trained observation format.
        return agentboard.run_episodes(policy, records, max_steps=ctx.max_steps)

    # An instruction and one worked example, as AgentBoard prompts chat models (its prompts are
    # one-shot chats); the example comes from a problem drawn apart from every evaluated one.
    CHAT_SYSTEM = ("You are an agent in a text environment. Each turn you see the current observation. "
                   "Reply with exactly one next action, on one line, in the same format as the example, "
                   "and nothing else.")
    EXAMPLE_SEED = 987_654_321

    def _chat_policy(self, policy: Callable[[list[str]], list[str]], ctx: Context) -> Callable[[list[str]], list[str]]:
        from lmforge.eval import agentboard

        (problem,) = agentboard.parse_records([("example", agentboard.generate(self.env, self.EXAMPLE_SEED, 1)[0])])
        example_obs, example_act = agentboard.expert_trajectory(problem)[0]

        def chat(observations: list[str]) -> list[str]:
            prompts = [render_messages(ctx.tokenizer, [
                {"role": "system", "content": self.CHAT_SYSTEM},
                {"role": "user", "content": example_obs},
                {"role": "assistant", "content": example_act.strip()},
                {"role": "user", "content": obs},
            ], "chat") for obs in observations]
            # The environments parse the zoo's " action" completions: keep the first line, with its space.
            return [" " + (a.strip().splitlines() or [""])[0].strip() for a in policy(prompts)]

        return chat

    def expert_pairs(self, records: list[Any], ctx: Context) -> list[tuple[str, str]]:
        from lmforge.eval import agentboard

        return [pair for p in records for pair in agentboard.expert_trajectory(p)]


class BlocksworldTask(_AgentBoardTask):
    name = "blocksworld"
    env = "blocksworld"
    action_tokens = 16  # " move A onto B" is 5 zoo tokens
    files = ("pddl.jsonl",)
    description = "AgentBoard PDDL blocksworld: progress rate (goal literals met), success, grounding accuracy"


class ToolQueryTask(_AgentBoardTask):
    name = "toolquery"
    env = "toolquery"
    action_tokens = 64  # the zoo's JSON calls take up to ~32 tokens
    files = ("tool-query.jsonl",)
    description = "AgentBoard-style tool query: 2-3 chained tool calls; progress rate, success, grounding accuracy"


for _t in (BlocksworldTask(), ToolQueryTask()):
    register(_t)


# --------------------------------------------------------------------------------------------------
# Tool use: T-Eval's six sub-tasks

# The official v2 file names (T-Eval's test_all_en.sh); one JSON file serves reason, retrieve and
# understand in the json format. ``review_json_v2.json`` is lmforge's own (T-Eval ships review as
# str only).
_RRU_JSON = "reason_retrieve_understand_json_v2.json"
TEVAL_FILES = {
    "instruct": ("instruct_v2.json",),
    "plan": ("plan_json_v2.json", "plan_str_v2.json"),
    "reason": (_RRU_JSON, "reason_str_v2.json"),
    "retrieve": (_RRU_JSON, "retrieve_str_v2.json"),
    "understand": (_RRU_JSON, "understand_str_v2.json"),
    "review": ("review_str_v2.json", "review_json_v2.json"),
}


class TEvalTask(SingleTurnTask):
    capability = "tool_use"

    def __init__(self, kind: str) -> None:
        from lmforge.eval import teval_data

        self.kind = kind
        self.name = f"teval_{kind}"
        self.primary = teval_data.primary(kind)
        self.files = TEVAL_FILES[kind]
        self.description = f"T-Eval {kind} (json and str formats): {self.primary}"
        self.default_n = 20  # per format

    def generate(self, folder: Path, seed: int, n: int) -> None:
        """The official files of this sub-task, each ``n`` records; the shared json file of
        reason/retrieve/understand is written once, from retrieve's generator (zoo prompt, the
        ``{"name", "arguments"}`` call keys declared in ``meta_data.response_keys``)."""
        from lmforge.eval import teval_data

        for name in self.files:
            path = folder / name
            if path.is_file():
                continue
            fmt = "json" if "_json_" in name or name == "instruct_v2.json" else "str"
            kind = "retrieve" if name == _RRU_JSON else self.kind
            records = teval_data.generate(kind, fmt, seed, n)
            if name == "instruct_v2.json":  # T-Eval's instruct file holds both formats, here alternating
                strs = teval_data.generate(kind, "str", seed + 1, n)
                records = dict(kv for pair in zip(records.items(), strs.items()) for kv in pair)
            teval_data.write(records, path)

    def items(self, path: Path, ctx: Context) -> list[Item]:
        from lmforge.eval import teval_data

        out = []
        for it in teval_data.load(path, self.kind):
            if ctx.fmt == "chat":
                prompt = render_messages(ctx.tokenizer, it.messages, "chat")
            else:
                # The zoo's tool-call records are written so that their plain rendering is the zoo
                # prompt; other records are official-style instructions either way.
                prompt = teval_data.render_plain(it.messages)
            # NOTE: T-Eval cuts a response only at end-of-turn markers (test.py's split_special_tokens,
            # applied in scoring), never at a line end: its string instruct answer spans three lines
            # (Thought / Action / Action Input), JSON may be pretty-printed. So no stop string here,
            # except for the zoo, which answers on one line and then runs on: its one-line records
            # stop at the line end, the multi-line formats (string plan and instruct) at a blank
            # line. Official runs allow 1024 new tokens; here 512, and 64 for the zoo, whose longest
            # gold call is under 50 tokens.
            if ctx.fmt == "zoo":
                stop: tuple[str, ...] = ("\n\n",) if it.fmt == "str" and it.kind in ("plan", "instruct") else ("\n",)
            else:
                stop = ()
            out.append(Item(
                id=f"{path.name}:{it.id}", prompt=prompt, reference=teval_data.reference(it),
                max_new_tokens=64 if ctx.fmt == "zoo" else 512, stop=stop, gold=it, meta={"fmt": it.fmt},
            ))
        return out

    def score(self, item: Item, response: str, ctx: Context) -> dict[str, float]:
        from lmforge.eval import teval_data
        from lmforge.eval.metrics import trigram_embed

        scores = teval_data.score(item.gold, response, embed=ctx.embed or trigram_embed)
        # Rows mix formats (json rows have thought/name/args, str rows only their own metric):
        # report the headline metric and the parse rate, the keys every row has.
        return {self.primary: float(scores[self.primary]), "parse_rate": float(scores.get("parse_rate", scores.get("format_metric", 0.0)))}


for _kind in ("instruct", "plan", "reason", "retrieve", "understand", "review"):
    register(TEvalTask(_kind))
