"""Markdown and HTML renderings of an exported session (used by :mod:`store.interchange.export`).

Every block kind of the vocabulary renders: text (as written: it is Markdown
already; in HTML, fenced code becomes ``<pre><code>``), thinking (only when
asked, collapsed), tool calls (collapsed: name and status in the summary,
arguments and result inside), attachments (HTML inlines image bytes from the
attachment store as ``data:`` URIs when small enough; a block whose blob was
evicted, marked ``evicted`` as ``session.get`` reads it, shows
``[attachment evicted: <name>]`` instead, with no ref), hosted web search
(queries and source links) and any unknown block (its JSON). Checkpoints are
dividers with their summary; subagent rows carry their agent name.

The HTML page is self-contained: inline CSS, no script, and a
Content-Security-Policy of ``default-src 'none'`` (images from ``data:``
only), so opening it never fetches anything.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Mapping
from typing import Any, BinaryIO

import orjson

from store.errors import InvalidInput
from store.transcripts.records import blocks_of

__all__ = ["HtmlWriter", "MarkdownWriter", "fence"]

ROLE_LABEL = {"user": "User", "assistant": "Assistant", "tool": "Tool", "system": "System"}
_TICKS = re.compile(r"`{3,}")
_INLINE_CODE = re.compile(r"`([^`\n]+)`")
_SAFE_URL = re.compile(r"^https?://", re.I)
EVICTED_NOTE = "its bytes were evicted from this host's attachment store and are not in this export"


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()


def fence(text: str, lang: str = "") -> str:
    """A Markdown code fence longer than any backtick run inside ``text``."""
    longest = max((len(m.group()) for m in _TICKS.finditer(text)), default=2)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text}\n{ticks}"


def _result_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    return _json(result)


def _git_fact(session: Mapping[str, Any]) -> str:
    """An imported session's recorded git state in a header line (``branch @ commit``), or ``""``."""
    git = session.get("historyGit")
    if not isinstance(git, Mapping):
        return ""
    branch, commit = git.get("branch"), git.get("commit")
    parts = [str(branch) if branch else "", f"@ {str(commit)[:12]}" if commit else ""]
    return " ".join(p for p in parts if p)


def _history_facts(session: Mapping[str, Any]) -> list[tuple[str, str]]:
    """An imported session's origin history in header facts (label, value): the model the history named last,
    its recorded git state, the session that spawned it."""
    facts: list[tuple[str, str]] = []
    model = session.get("historyModel")
    if isinstance(model, Mapping) and model.get("modelId"):
        provider = model.get("providerId")
        facts.append(("History model", f"{provider}/{model['modelId']}" if provider else str(model["modelId"])))
    if git := _git_fact(session):
        facts.append(("Git", git))
    spawn = session.get("spawnedBy")
    if isinstance(spawn, Mapping) and spawn.get("sessionId"):
        facts.append(("Spawned by", str(spawn["sessionId"])))
    return facts


def _meta(record: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = record.get("meta")
    return meta if isinstance(meta, Mapping) else {}


class _Writer:
    def __init__(self, out: BinaryIO, options: Any) -> None:
        self.out = out
        self.options = options
        self.written = 0

    def emit(self, text: str) -> None:
        data = text.encode("utf-8")
        self.out.write(data)
        self.written += len(data)


# --------------------------------------------------------------------------- Markdown


class MarkdownWriter(_Writer):
    def begin(self, session: Mapping[str, Any]) -> None:
        title = session.get("title") or session["id"]
        lines = [f"# {title}", ""]
        facts = [f"Session `{session['id']}`"]
        for key, label in (("source", "Imported from"), ("projectPath", "Project"), ("modelId", "Model")):
            if session.get(key):
                facts.append(f"{label}: `{session[key]}`")
        facts += [f"{label}: `{value}`" for label, value in _history_facts(session)]
        facts.append(f"Messages: {session.get('messageCount', 0)}")
        lines += [" · ".join(facts), ""]
        self.emit("\n".join(lines) + "\n")

    def message(self, record: Mapping[str, Any]) -> None:
        role = str(record.get("role"))
        meta = _meta(record)
        head = ROLE_LABEL.get(role, role)
        if role == "tool" and isinstance(record.get("toolName"), str):
            head += f" · `{record['toolName']}`"
        if meta.get("agentName"):
            head += f" · subagent {meta['agentName']}"
        parts = [f"### {head}", f"*{record.get('createdAt', '')}*", ""]
        for block in blocks_of(record):
            if isinstance(block, Mapping):
                parts.append(self.block(block))
                parts.append("")
        self.emit("\n".join(parts) + "\n")

    def block(self, block: Mapping[str, Any]) -> str:
        kind = block.get("type")
        if kind == "text":
            return str(block.get("text", ""))
        if kind == "thinking":
            quoted = "\n".join(f"> {line}" for line in str(block.get("text", "")).splitlines()) or "> (redacted)"
            return f"<details><summary>Thinking</summary>\n\n{quoted}\n\n</details>"
        if kind == "tool_call":
            name = html.escape(str(block.get("name", "")))
            status = html.escape(str(block.get("status") or "no result"))
            body = [f"<details><summary>Tool call <code>{name}</code> — {status}</summary>", "",
                    "**Arguments**", "", fence(_json(block.get("args")), "json")]
            if "result" in block:
                body += ["", "**Result**", "", fence(_result_text(block.get("result")))]
            return "\n".join([*body, "", "</details>"])
        if kind == "attachment":
            size = f", {block['size']} bytes" if isinstance(block.get("size"), int) else ""
            what = f"{block.get('mimeType', block.get('kind'))}{size}"
            if block.get("evicted") is True:  # no ref: it names bytes that are gone
                return f"[attachment evicted: **{block.get('name', '')}**] — {what}; {EVICTED_NOTE}"
            return f"Attachment: **{block.get('name', '')}** ({what}) — `{block.get('ref', '')}`"
        if kind == "hostedSearch":
            lines = [f"**Web search** ({block.get('status', '')})"]
            for rnd in block.get("rounds") or ():
                if isinstance(rnd, Mapping):
                    what = rnd.get("query") or rnd.get("url") or rnd.get("kind") or ""
                    lines.append(f"- {what}")
                    for src in rnd.get("sources") or ():
                        if isinstance(src, Mapping):
                            lines.append(f"  - [{src.get('title') or src.get('url')}]({src.get('url')})")
            return "\n".join(lines)
        return f"*{kind} block*\n\n" + fence(_json(dict(block)), "json")

    def checkpoint(self, record: Mapping[str, Any]) -> None:
        tokens = record.get("tokensBefore")
        quoted = "\n".join(f"> {line}" for line in str(record.get("summary", "")).splitlines())
        self.emit(f"---\n\n**Context compacted** (tokens before: {tokens})\n\n{quoted}\n\n---\n\n")

    def environment(self, env: Mapping[str, Any]) -> None:
        self.emit(f"<details><summary>Run environment of turn <code>{html.escape(str(env['turnId']))}</code>"
                  f"</summary>\n\n{fence(_json(env['snapshot']), 'json')}\n\n</details>\n\n")

    def end(self) -> None:
        return None


# --------------------------------------------------------------------------- HTML

CSS = """
:root{color-scheme:light dark;--bg:#fff;--fg:#1d1f23;--muted:#6a6f78;--line:#e2e4e8;--user:#eef4ff;--tool:#f6f6f7;
--sys:#fff8e6;--code:#f3f3f4}
@media (prefers-color-scheme:dark){:root{--bg:#15171a;--fg:#e7e8ea;--muted:#9aa0a8;--line:#2b2e33;--user:#1c2533;
--tool:#1d1f23;--sys:#2a2416;--code:#22252a}}
body{margin:0;background:var(--bg);color:var(--fg);font:15px/1.55 system-ui,-apple-system,Segoe UI,sans-serif}
main{max-width:880px;margin:0 auto;padding:24px 18px 64px}
h1{font-size:1.5em;margin:0 0 4px} .facts{color:var(--muted);font-size:.9em;margin-bottom:20px}
.msg{border:1px solid var(--line);border-radius:10px;padding:10px 14px;margin:12px 0}
.msg.user{background:var(--user)} .msg.tool{background:var(--tool)} .msg.system{background:var(--sys)}
.msg.subagent{margin-left:28px;border-style:dashed}
.msg>header{display:flex;gap:10px;align-items:baseline;color:var(--muted);font-size:.85em;margin-bottom:4px}
.role{font-weight:600;color:var(--fg)} pre{background:var(--code);padding:10px;border-radius:6px;overflow:auto;
white-space:pre-wrap;word-break:break-word} code{background:var(--code);padding:0 3px;border-radius:3px}
pre code{padding:0} details{margin:6px 0} summary{cursor:pointer} .status{font-size:.85em;padding:0 6px;
border-radius:8px;border:1px solid var(--line)} .status-error,.status-denied{color:#c0392b}
.compaction{border-top:2px dashed var(--line);border-bottom:2px dashed var(--line);margin:18px 0;padding:6px 0;
color:var(--muted)} img{max-width:100%} .attachment{color:var(--muted)} p{margin:6px 0}
"""
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def render_text(text: str) -> str:
    """Plain text with fenced code blocks and inline code, everything escaped."""
    out: list[str] = []
    para: list[str] = []
    code: list[str] | None = None
    lang = ""

    def flush() -> None:
        if para:
            out.append("<p>" + "<br>".join(_inline(line) for line in para) + "</p>")
            para.clear()

    for line in text.split("\n"):
        stripped = line.strip()
        if code is not None:
            if stripped.startswith("```"):
                cls = f' class="language-{html.escape(lang)}"' if lang else ""
                out.append(f"<pre><code{cls}>{html.escape(chr(10).join(code))}</code></pre>")
                code = None
            else:
                code.append(line)
        elif stripped.startswith("```"):
            flush()
            code, lang = [], stripped.strip("`").strip()[:40]
        elif not stripped:
            flush()
        else:
            para.append(line)
    if code is not None:
        out.append(f"<pre><code>{html.escape(chr(10).join(code))}</code></pre>")
    flush()
    return "\n".join(out)


def _inline(line: str) -> str:
    pieces = []
    last = 0
    for match in _INLINE_CODE.finditer(line):
        pieces.append(html.escape(line[last:match.start()]))
        pieces.append(f"<code>{html.escape(match.group(1))}</code>")
        last = match.end()
    pieces.append(html.escape(line[last:]))
    return "".join(pieces)


class HtmlWriter(_Writer):
    def begin(self, session: Mapping[str, Any]) -> None:
        title = html.escape(str(session.get("title") or session["id"]))
        facts = [f"Session <code>{html.escape(str(session['id']))}</code>"]
        for key, label in (("source", "Imported from"), ("projectPath", "Project"), ("modelId", "Model")):
            if session.get(key):
                facts.append(f"{label} <code>{html.escape(str(session[key]))}</code>")
        facts += [f"{label} <code>{html.escape(value)}</code>" for label, value in _history_facts(session)]
        facts.append(f"{int(session.get('messageCount') or 0)} messages")
        self.emit(
            "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{title}</title><style>{CSS}</style></head>\n<body><main>\n"
            f"<header><h1>{title}</h1><div class=\"facts\">{' · '.join(facts)}</div></header>\n")

    def message(self, record: Mapping[str, Any]) -> None:
        role = str(record.get("role"))
        meta = _meta(record)
        classes = ["msg", html.escape(role)]
        label = ROLE_LABEL.get(role, html.escape(role))
        if role == "tool" and isinstance(record.get("toolName"), str):
            label += f" · {html.escape(record['toolName'])}"
        extra = ""
        if meta.get("agentName"):
            classes.append("subagent")
            extra = f"<span>subagent {html.escape(str(meta['agentName']))}</span>"
        body = "\n".join(self.block(b) for b in blocks_of(record) if isinstance(b, Mapping))
        self.emit(f"<article class=\"{' '.join(classes)}\" id=\"{html.escape(str(record.get('id')))}\">"
                  f"<header><span class=\"role\">{label}</span><time>{html.escape(str(record.get('createdAt', '')))}"
                  f"</time>{extra}</header>\n{body}\n</article>\n")

    def block(self, block: Mapping[str, Any]) -> str:
        kind = block.get("type")
        if kind == "text":
            return render_text(str(block.get("text", "")))
        if kind == "thinking":
            text = str(block.get("text", "")) or "(redacted)"
            return f"<details class=\"thinking\"><summary>Thinking</summary>{render_text(text)}</details>"
        if kind == "tool_call":
            status = str(block.get("status") or "no result")
            head = (f"<summary>Tool call <code>{html.escape(str(block.get('name', '')))}</code> "
                    f"<span class=\"status status-{html.escape(status)}\">{html.escape(status)}</span></summary>")
            parts = [f"<details class=\"tool\">{head}<h4>Arguments</h4><pre>{html.escape(_json(block.get('args')))}"
                     "</pre>"]
            if "result" in block:
                parts.append(f"<h4>Result</h4><pre>{html.escape(_result_text(block.get('result')))}</pre>")
            return "".join(parts) + "</details>"
        if kind == "attachment":
            return self.attachment(block)
        if kind == "hostedSearch":
            items = []
            for rnd in block.get("rounds") or ():
                if not isinstance(rnd, Mapping):
                    continue
                sources = "".join(self.link(s) for s in rnd.get("sources") or () if isinstance(s, Mapping))
                what = html.escape(str(rnd.get("query") or rnd.get("url") or rnd.get("kind") or ""))
                items.append(f"<li>{what}<ul>{sources}</ul></li>")
            return (f"<div class=\"search\"><b>Web search</b> ({html.escape(str(block.get('status', '')))})"
                    f"<ul>{''.join(items)}</ul></div>")
        return (f"<details class=\"unknown\"><summary>{html.escape(str(kind))} block</summary>"
                f"<pre>{html.escape(_json(dict(block)))}</pre></details>")

    def link(self, source: Mapping[str, Any]) -> str:
        url = str(source.get("url", ""))
        title = html.escape(str(source.get("title") or url))
        if _SAFE_URL.match(url):
            return f"<li><a href=\"{html.escape(url)}\" rel=\"noreferrer noopener\">{title}</a></li>"
        return f"<li>{title}</li>"

    def attachment(self, block: Mapping[str, Any]) -> str:
        name = html.escape(str(block.get("name", "")))
        mime = str(block.get("mimeType") or "")
        ref = str(block.get("ref", ""))
        size = f", {block['size']} bytes" if isinstance(block.get("size"), int) else ""
        if block.get("evicted") is True:  # never inlined: bytes still on disk are on their way out
            return (f"<p class=\"attachment evicted\">[attachment evicted: <b>{name}</b>] — "
                    f"{html.escape(mime or 'file')}{size}; {EVICTED_NOTE}</p>")
        store = self.options.attachments
        if store is not None and mime.startswith("image/") and ref.startswith("attachments/"):
            try:
                path = store.path(ref.removeprefix("attachments/"))
                if path.is_file() and path.stat().st_size <= self.options.max_inline_image_bytes:
                    data = base64.b64encode(path.read_bytes()).decode()
                    return (f"<figure><img alt=\"{name}\" src=\"data:{html.escape(mime)};base64,{data}\">"
                            f"<figcaption>{name}</figcaption></figure>")
            except (OSError, InvalidInput):
                pass
        return f"<p class=\"attachment\">Attachment: <b>{name}</b> ({html.escape(mime or 'file')}{size})</p>"

    def checkpoint(self, record: Mapping[str, Any]) -> None:
        self.emit(f"<div class=\"compaction\"><b>Context compacted</b> (tokens before: "
                  f"{html.escape(str(record.get('tokensBefore')))})<details><summary>Summary</summary>"
                  f"{render_text(str(record.get('summary', '')))}</details></div>\n")

    def environment(self, env: Mapping[str, Any]) -> None:
        self.emit(f"<details class=\"env\"><summary>Run environment of turn <code>{html.escape(str(env['turnId']))}"
                  f"</code></summary><pre>{html.escape(_json(env['snapshot']))}</pre></details>\n")

    def end(self) -> None:
        self.emit("</main></body></html>\n")
