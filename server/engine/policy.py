"""Policies of the built-in engine. None of them is a model: they produce scripted replies.

- `oracle`: finds the task whose problem statement is in the prompt and applies its gold patch through the
  agent's own tools (edit if it has one, else bash + git apply), then says it is done (or runs the submission
  command the agent's prompt names: mini-swe-agent's `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`). Aider, which
  has no tools, gets the patch as the SEARCH/REPLACE blocks of its edit format, in the reply text; Terminus-2,
  which types into a terminal, gets it as keystrokes in its JSON / XML reply format (`keystrokes_plan`).
- `oracle+compact`: the oracle for long sessions: it reads the output of a long shell command again and again until
  the agent compacts its context (answering the agent's own summary request with a summary that keeps the task),
  and only then applies the gold patch. With an engine whose context is small, the rollout must compact to pass.
- `oracle+probe`, `oracle+probe:CMD`: the oracle, running one shell command first (PROBE, or CMD); its output lands
  in the next prompt.
- `noop`: answers "done" at once (mini-swe-agent: runs its submission command at once).
- `script:FILE`: replays a JSON list of replies, one per model call (`{"content": ...}` or
  `{"tool_calls": [{"name": ..., "arguments": {...}}]}`), then answers "done".
"""

from __future__ import annotations

import base64
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swe_gym_env.tasks.catalog import find_by_problem_statement
from swe_gym_env.tasks.models import Task

DONE = "I have made the change. Done."
# mini-swe-agent 2.4.6's submission (its mini.yaml instance template): this bash command alone, as its `bash` tool's
# `command`; the output's first line is the sentinel, which ends its run (environments/local.py: _check_finished)
SUBMIT_COMMAND = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@dataclass
class Reply:
    content: str | None = None
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def find_task(prompt_text: str) -> Task | None:
    """The task whose problem statement is in the prompt; else the one it is in once the space Qwen Code 0.24's
    @-reference parser puts before an `@token` it could not resolve (`@retry(...)` -> ` @retry(...)`) is taken out
    again (the agent sends the task as it rewrote it)."""
    return find_by_problem_statement(prompt_text) or find_by_problem_statement(prompt_text.replace(" @", "@"))


def _step(messages: list[dict]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant")


def _tool_params(tools: list[dict] | None) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for t in tools or []:
        fn = t.get("function") or {}
        props = (fn.get("parameters") or {}).get("properties") or {}
        if fn.get("name"):
            out[fn["name"]] = set(props)
    return out


class Policy:
    name = "base"

    def reply(self, messages: list[dict], tools: list[dict] | None) -> Reply:
        raise NotImplementedError


def submission(messages: list[dict], tools: list[dict] | None) -> Reply | None:
    """The agent's own way of saying it is done where its prompt names one (mini-swe-agent: SUBMIT_COMMAND through
    its shell tool; a text reply is a format error there), else None."""
    prompt = "\n".join(_text(m.get("content")) for m in messages if m.get("role") in ("user", "system"))
    params = _tool_params(tools)
    shell = next(((n, arg) for n, arg in SHELL_TOOLS if arg in params.get(n, set())), None)
    if SUBMIT_COMMAND not in prompt or shell is None:
        return None
    return Reply(tool_calls=[(shell[0], {shell[1]: SUBMIT_COMMAND})])


class NoopPolicy(Policy):
    name = "noop"

    def reply(self, messages, tools):
        return submission(messages, tools) or Reply(content="done")


class ScriptPolicy(Policy):
    def __init__(self, path: Path) -> None:
        self.name = f"script:{path}"
        data = json.loads(path.read_text())
        if not isinstance(data, list):
            raise ValueError(f"{path}: a script is a JSON list of replies")
        self.replies = [
            Reply(
                content=r.get("content"),
                tool_calls=[(c["name"], c.get("arguments", {})) for c in r.get("tool_calls", [])],
            )
            for r in data
        ]

    def reply(self, messages, tools):
        step = _step(messages)
        return self.replies[step] if step < len(self.replies) else Reply(content=DONE)


def _hunks(patch: str) -> list[tuple[str, str, str]]:
    """(path, old_text, new_text) per hunk of a unified diff."""
    out: list[tuple[str, str, str]] = []
    path = None
    old: list[str] | None = None
    new: list[str] = []

    def flush() -> None:
        if path and old is not None and (old or new):
            out.append((path, "\n".join(old), "\n".join(new)))

    for line in patch.splitlines():
        if line.startswith("+++ "):
            flush()
            old = None
            path = line[4:].removeprefix("b/")
        elif line.startswith("--- ") or line.startswith("diff --git") or line.startswith("index "):
            continue
        elif line.startswith("@@"):
            flush()
            old, new = [], []
        elif old is not None:
            if line.startswith(" "):
                old.append(line[1:])
                new.append(line[1:])
            elif line.startswith("-"):
                old.append(line[1:])
            elif line.startswith("+"):
                new.append(line[1:])
            elif line == "":
                old.append("")
                new.append("")
    flush()
    return out


class OraclePolicy(Policy):
    """Applies the task's gold patch through the agent's own tools. With ``probe`` (policy `oracle+probe`) it first
    runs one shell command through the agent's shell tool and then goes on: its output lands in the next prompt,
    so a test can read from the capture what the agent's commands saw (their environment, what is on PATH)."""

    name = "oracle"

    def __init__(self, probe: str | None = None) -> None:
        self.probe = probe
        if probe:
            self.name = "oracle+probe"

    def plan(
        self, task: Task, tools: list[dict] | None, workdir: str | None = None, submit: bool = False
    ) -> list[Reply]:
        """The gold patch through the agent's own tools, in the work tree its prompt names (else the task's); with
        ``submit`` (the agent's prompt names a submission command) it ends with that command, else with "done"."""
        workdir = workdir or task.workdir
        params = _tool_params(tools)
        shell = next(((n, arg) for n, arg in SHELL_TOOLS if arg in params.get(n, set())), None)
        actions = _edit_calls(task, params, workdir)
        if actions is None and shell is not None:  # bash (Pi, OpenCode), exec_command / shell_command (codex), ...
            actions = [_shell_call(shell, params, _git_apply(task.patch, workdir), "apply the fix")]
        actions = actions or []
        if self.probe and shell is not None:
            actions.insert(0, _shell_call(shell, params, self.probe, "look at the environment"))
        if submit and shell is not None:  # mini-swe-agent: a reply without a tool call is a format error
            return [*actions, Reply(tool_calls=[(shell[0], {shell[1]: SUBMIT_COMMAND})])]
        return [*actions, Reply(content=DONE)]

    def keystrokes_plan(self, task: Task, workdir: str | None, fmt: str) -> list[Reply]:
        """The gold patch as keystrokes for an agent without tools that types into a terminal (Terminus-2, reply
        format ``fmt``): the patch base64-encoded (no heredoc, no tab for the shell's completion to take) in one
        command line, or, longer than `KEYSTROKE_CHUNK`, written to a file in pieces of that size, one reply each (a
        reply cut at the rollout's max_tokens would be asked again); then "task complete" twice (it asks once to
        confirm)."""
        b64 = base64.b64encode(task.patch.encode()).decode()
        cd = shlex.quote(workdir or task.workdir)
        apply = "git apply && git status --short\n"
        if len(b64) <= KEYSTROKE_CHUNK:
            lines = [f"cd {cd} && printf %s {b64} | base64 -d | {apply}"]
        else:
            pieces = [b64[i : i + KEYSTROKE_CHUNK] for i in range(0, len(b64), KEYSTROKE_CHUNK)]
            lines = [f"printf %s {c} {'>>' if i else '>'} {PATCH_FILE}\n" for i, c in enumerate(pieces)]
            lines.append(f"cd {cd} && base64 -d {PATCH_FILE} | {apply}")
        if self.probe:
            lines.insert(0, self.probe + "\n")
        return [*(_keystrokes(fmt, [line], False) for line in lines), _keystrokes(fmt, [], True)]

    def reply(self, messages, tools):
        prompt_text = "\n".join(_text(m.get("content")) for m in messages if m.get("role") in ("user", "system"))
        task = find_task(prompt_text)
        if task is None:
            return Reply(content="oracle: no known task's problem statement is in this prompt; nothing to do.")
        if not tools and EDIT_BLOCK_MARK in prompt_text:  # Aider: an editor, its edits are blocks in the reply
            return edit_block_reply(task, messages)
        where = WORKDIR_IN_PROMPT.search(prompt_text)  # as an agent would: the work tree its prompt names
        fmt = None if tools else next((f for f, mark in KEYSTROKE_FORMATS.items() if mark in prompt_text), None)
        if fmt is not None:  # Terminus-2: no tools; keystrokes for its terminal, in its reply format
            keys = self.keystrokes_plan(task, where.group(1) if where else None, fmt)
            return keys[min(_step(messages), len(keys) - 1)]
        plan = self.plan(task, tools, where.group(1) if where else None, SUBMIT_COMMAND in prompt_text)
        step = _step(messages)
        return plan[step] if step < len(plan) else Reply(content=DONE)


# -- Aider: no tools; its edits are SEARCH/REPLACE blocks in the reply text (aider-chat 0.86's `diff` edit format) ---
EDIT_BLOCK_MARK = "<<<<<<< SEARCH"  # in the examples of its system prompt
# its reply when the oracle's blocks named files not yet in its chat: it adds them and drops the edits, then asks again
FILES_ADDED = "I added these files to the chat:"


def edit_blocks(patch: str) -> str:
    """The gold patch as Aider's SEARCH/REPLACE blocks: per hunk its path (relative to the repository root, where
    Aider runs), then the old text and the new (an empty SEARCH makes a new file)."""
    blocks = ["Here are the *SEARCH/REPLACE* blocks:"]
    for path, old, new in _hunks(patch):
        search = f"{old}\n" if old else ""
        replace = f"{new}\n" if new else ""
        blocks.append(f"{path}\n```\n<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n```")
    return "\n\n".join(blocks) + "\n"


def edit_block_reply(task: Task, messages: list[dict]) -> Reply:
    """Aider's next reply: the blocks, again once if it answered that it added the files they name to its chat (it
    applies no edit to a file it had to add), then "done". Steps count from the message that holds the task (its
    prompt begins with example conversations of its own)."""
    start = next((i for i, m in enumerate(messages) if task.problem_statement.strip() in _text(m.get("content"))), 0)
    step = _step(messages[start:])
    last = _text(messages[-1].get("content")) if messages else ""
    if step == 0 or (step == 1 and last.startswith(FILES_ADDED)):
        return Reply(content=edit_blocks(task.patch))
    return Reply(content=DONE)


# -- long sessions: hold the fix back until the agent has compacted its context -------------------------------------
# What the agents send when they compact (read from their installed bundles): Pi 0.73.1
# (pi-coding-agent/dist/core/compaction/compaction.js: SUMMARIZATION_PROMPT, UPDATE_SUMMARIZATION_PROMPT,
# TURN_PREFIX_SUMMARIZATION_PROMPT; utils.js: SUMMARIZATION_SYSTEM_PROMPT) and OpenCode 1.18.33 (SessionCompaction's
# buildPrompt in the binary: a new summary, or one merged with its <prior-summary>).
SUMMARY_REQUESTS = (
    "Create a structured context checkpoint summary",  # Pi, first summary
    "Update the existing structured summary",  # Pi, merging into the previous one
    "This is the PREFIX of a turn that was too large to keep",  # Pi, a turn cut in two (one long user turn)
    "You are a context summarization assistant",  # Pi's system prompt for all three
    "Create a new anchored summary from the conversation history",  # OpenCode, first summary
    "Construct a new summary that combines both",  # OpenCode, merging into its <prior-summary>
)
SUMMARY_MARK = "[swe-gym-oracle summary]"  # in every summary the oracle writes: its prompt then holds it once compacted
FILLER_MARK = "swe-gym-filler"  # in every command the oracle runs to fill the context
FILLER_LINES = 60  # lines per filler command: ~900 tokens of output each (SmolLM2's tokenizer)
FILLER = (
    f"echo {FILLER_MARK}; for i in $(seq 1 {FILLER_LINES}); "
    'do echo "line $i of the long listing: the quick brown fox jumps over the lazy dog"; done'
)


def _all_text(messages: list[dict]) -> list[str]:
    """Each message's text, tool calls included (whatever its role)."""
    return [_text(m.get("content")) + json.dumps(m.get("tool_calls") or []) for m in messages]


class CompactingOraclePolicy(OraclePolicy):
    """The oracle that holds its fix back until the agent has compacted its context (policy `oracle+compact`).

    Before compaction each reply is one long shell command (`FILLER`), so the prompt grows until the agent
    compacts; the agent's summary request (`SUMMARY_REQUESTS`) is answered with a summary that keeps the task (its
    work tree and problem statement, as a real summary would) and carries `SUMMARY_MARK`. A prompt that holds the
    mark is one after compaction: the gold patch's steps follow, counted from the summary on (filler calls the agent
    kept are not steps)."""

    name = "oracle+compact"

    def reply(self, messages, tools):
        texts = _all_text(messages)
        text = "\n".join(texts)
        task = find_task(text)
        if task is None:
            return Reply(content="oracle: no known task's problem statement is in this prompt; nothing to do.")
        where = WORKDIR_IN_PROMPT.search(text)
        workdir = where.group(1) if where else task.workdir
        last = "\n".join(texts[-2:])  # the request itself (Pi: system + user; OpenCode: its one user message)
        if any(s in last for s in SUMMARY_REQUESTS):
            return Reply(
                content=f"{SUMMARY_MARK}\n## Goal\nYou are working in a git repository at {workdir}. Resolve the "
                f"issue below.\n\n<issue>\n{task.problem_statement.strip()}\n</issue>\n\n## Progress\n- Read "
                "long listings; nothing changed yet.\n\n## Next Steps\n1. Apply the fix."
            )
        marked = [i for i, t in enumerate(texts) if SUMMARY_MARK in t]
        params = _tool_params(tools)
        shell = next(((n, arg) for n, arg in SHELL_TOOLS if arg in params.get(n, set())), None)
        if not marked:
            if shell is None:
                return Reply(content="oracle+compact: the agent has no shell tool to fill its context with.")
            name, arg = shell
            args: dict[str, Any] = {arg: FILLER}
            if "description" in params[name]:
                args["description"] = "read a long listing"
            return Reply(tool_calls=[(name, args)])
        after = messages[marked[-1] + 1 :]
        step = sum(
            1
            for m, t in zip(after, texts[marked[-1] + 1 :], strict=True)
            if m.get("role") == "assistant" and FILLER_MARK not in t
        )
        plan = self.plan(task, tools, workdir, SUBMIT_COMMAND in text)
        return plan[step] if step < len(plan) else Reply(content=DONE)


# shell tools by name, with the argument that takes the command line
SHELL_TOOLS = (
    ("bash", "command"),
    ("exec_command", "cmd"),
    ("shell_command", "command"),
    ("Bash", "command"),
    ("run_shell_command", "command"),
    ("terminal", "command"),  # OpenHands' terminal tool
    ("Shell", "command"),  # Kimi CLI
    ("Execute", "command"),  # Droid (with a required `summary`)
)


def _codex_patch(patch: str, workdir: str) -> str:
    """A unified diff as codex's apply_patch envelope (`*** Update File:` sections, `@@` hunks, ' '/'-'/'+' lines)."""
    lines = ["*** Begin Patch"]
    for line in patch.splitlines():
        if line.startswith("+++ "):
            lines.append(f"*** Update File: {workdir}/{line[4:].removeprefix('b/')}")
        elif line.startswith(("--- ", "diff --git", "index ")):
            continue
        elif line.startswith("@@"):
            lines.append("@@")
        elif line[:1] in (" ", "-", "+"):
            lines.append(line)
        elif line == "":
            lines.append(" ")
    lines.append("*** End Patch")
    return "\n".join(lines) + "\n"


# agents that answer in text a terminal is driven by (Terminus-2's templates), by the line its prompt says it in
KEYSTROKE_FORMATS = {"json": "Format your response as JSON", "xml": "Format your response as XML"}
KEYSTROKE_CHUNK = 800  # base64 characters a reply types at most: ~600 SmolLM2 tokens, within a 1,024-token reply
PATCH_FILE = "/tmp/swe-gym-oracle-patch.b64"


def _keystrokes(fmt: str, lines: list[str], complete: bool) -> Reply:
    """One Terminus-2 reply: ``lines`` typed into its terminal (1 s each), ``complete`` its task_complete."""
    analysis, plan = "The fix is the task's gold patch.", "Apply it." if lines else "The task is complete."
    if fmt == "xml":
        keys = "".join(f'<keystrokes duration="1.0">{line}</keystrokes>\n' for line in lines)
        return Reply(
            content=f"<response>\n<analysis>{analysis}</analysis>\n<plan>{plan}</plan>\n<commands>\n{keys}"
            f"</commands>\n<task_complete>{str(complete).lower()}</task_complete>\n</response>"
        )
    commands = [{"keystrokes": line, "duration": 1.0} for line in lines]
    body = {"analysis": analysis, "plan": plan, "commands": commands, "task_complete": complete}
    return Reply(content=json.dumps(body, indent=2))


WORKDIR_IN_PROMPT = re.compile(r"working in a git repository at (/\S+?)\.\s")


# what `oracle+probe` asks the agent's shell first: the Python and env its commands get, and whether a node exists
PROBE = 'echo "probe: python=$(command -v python) env=${CONDA_DEFAULT_ENV:-none} node=$(command -v node || echo none)"'


def make_policy(spec: str) -> Policy:
    if spec == "oracle":
        return OraclePolicy()
    if spec == "oracle+probe":
        return OraclePolicy(probe=PROBE)
    if spec.startswith("oracle+probe:"):  # a probe of the caller's own: `oracle+probe:<shell command>`
        return OraclePolicy(probe=spec.removeprefix("oracle+probe:"))
    if spec == "oracle+compact":
        return CompactingOraclePolicy()
    if spec == "noop":
        return NoopPolicy()
    if spec.startswith("script:"):
        return ScriptPolicy(Path(spec.removeprefix("script:")))
    raise ValueError(f"unknown policy {spec!r}: use oracle, oracle+probe[:CMD], oracle+compact, noop or script:FILE")


def _edit_calls(task: Task, params: dict[str, set[str]], workdir: str) -> list[Reply] | None:
    """The gold patch through the agent's own edit tool, where it has one this policy knows; else None."""
    edit = params.get("edit", set())
    hunks = _hunks(task.patch)
    file_edit = params.get("Edit", set()) | params.get("replace", set())
    if "edits" in edit and "path" in edit:  # Pi: edit{path, edits:[{oldText,newText}]}
        by_file: dict[str, list[dict]] = {}
        for path, old, new in hunks:
            by_file.setdefault(path, []).append({"oldText": old, "newText": new})
        return [Reply(tool_calls=[("edit", {"path": p, "edits": e})]) for p, e in by_file.items()]
    if {"filePath", "oldString", "newString"} <= edit:  # OpenCode
        return [
            Reply(tool_calls=[("edit", {"filePath": f"{workdir}/{p}", "oldString": o, "newString": n})])
            for p, o, n in hunks
        ]
    if {"path", "old_text", "new_text"} <= params.get("editor", set()):  # Cline
        return [
            Reply(tool_calls=[("editor", {"path": f"{workdir}/{p}", "old_text": o, "new_text": n})])
            for p, o, n in hunks
        ]
    if "input" in params.get("apply_patch", set()):  # codex: apply_patch (a custom tool: one string `input`)
        return [Reply(tool_calls=[("apply_patch", {"input": _codex_patch(task.patch, workdir)})])]
    if {"file_path", "old_string", "new_string"} <= file_edit:  # claude-code Edit, gemini-cli replace
        return _file_path_edits(hunks, params, file_edit, workdir)
    return None


def _file_path_edits(
    hunks: list[tuple[str, str, str]], params: dict[str, set[str]], file_edit: set[str], workdir: str
) -> list[Reply]:
    """claude-code's Edit (each file Read first: it edits only what it read) or gemini-cli's replace."""
    tool = "Edit" if "Edit" in params else "replace"
    read = "Read" if "file_path" in params.get("Read", set()) else None
    actions: list[Reply] = []
    for path in dict.fromkeys(p for p, _, _ in hunks):
        if read:
            actions.append(Reply(tool_calls=[(read, {"file_path": f"{workdir}/{path}"})]))
        for p, o, n in hunks:
            if p == path:
                args = {"file_path": f"{workdir}/{p}", "old_string": o, "new_string": n}
                if tool == "replace" and "instruction" in file_edit:
                    args["instruction"] = f"apply the fix to {p}"
                actions.append(Reply(tool_calls=[(tool, args)]))
    return actions


def _git_apply(patch: str, workdir: str) -> str:
    """A shell command that applies ``patch`` in ``workdir`` from a here-document."""
    delim = "SWE_GYM_PATCH_EOF"
    while delim in patch:
        delim += "_"
    return f"cd {shlex.quote(workdir)} && git apply <<'{delim}'\n{patch.rstrip(chr(10))}\n{delim}"


def _shell_call(shell: tuple[str, str], params: dict[str, set[str]], command: str, why: str) -> Reply:
    """One call of the agent's shell tool; its description (OpenCode's bash, claude-code's Bash) or summary
    (Droid's Execute) where the tool has one."""
    name, arg = shell
    args: dict[str, Any] = {arg: command}
    if "description" in params[name]:
        args["description"] = why
    if "summary" in params[name]:
        args["summary"] = why
    return Reply(tool_calls=[(name, args)])
