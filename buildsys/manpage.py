"""An argparse parser as a man page (roff), with the standard library alone.

The build (santhrottle_build.py) writes santhrottle(8) and santhrottled(8) from
the programs' parsers.  The layout is the "pretty" one of argparse-manpage:

    .TH, NAME (prog - summary), SYNOPSIS (the usage line), DESCRIPTION,
    OPTIONS (every option: .TP, the invocation in bold, the help), then
    COMMANDS: one line per verb, and for each verb (depth first) a section
    COMMAND 'prog verb' with its usage and description, and its options in
    OPTIONS 'prog verb'; then the extra sections (EXAMPLES, EXIT STATUS, ...)

written here rather than taken from argparse-manpage so that the Debian
package builds with what Debian 12 has (its python3-argparse-manpage is 1.2,
without this layout).  Like argparse-manpage it reads argparse's private
parts (_actions, _action_groups, _choices_actions): argparse has no public
walk of a parser.

Worked example
    page = render(parser, section=8, date="2026-11-28", source="santhrottle 0.1.0",
                  manual="System Administration", summary="the daemon",
                  sections=[("examples", ".nf\\nsanthrottled \\\\-\\\\-check\\n.fi")])
"""

from __future__ import annotations

import argparse

# argparse's own group titles -> the page's (None: no heading)
GROUP_TITLES = {"positional arguments": None, "options": "OPTIONS", "optional arguments": "OPTIONS"}


def markup(text: str) -> str:
    """Plain text in roff: backslashes and hyphens escaped."""
    return text.replace("\\", "\\\\").replace("-", "\\-")


def bold(text: str) -> str:
    return f"\\fB{markup(text)}\\fR"


def italic(text: str) -> str:
    return f"\\fI\\,{markup(text)}\\/\\fR"


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter for the pieces it already knows how to make: an
    option's metavar and arguments, a help string with %(default)s expanded."""

    def invocation(self, action: argparse.Action) -> str:
        if not action.option_strings:
            (metavar,) = self._metavar_formatter(action, action.dest)(1)
            return bold(metavar)
        if action.nargs == 0:
            return ", ".join(bold(o) for o in action.option_strings)
        args = self._format_args(action, action.dest.upper())
        return ", ".join(f"{bold(o)} {italic(args)}" for o in action.option_strings)

    def help_of(self, action: argparse.Action) -> str:
        return self._expand_help(action)


class _Page:
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.prog = parser.prog
        self.fmt = _Formatter(parser.prog)
        self.fill = parser._get_formatter()  # the top parser's: its class and width

    def text(self, text: str) -> str:
        """A help text filled as the top parser's --help fills it, in roff."""
        return markup(self.fill._format_text(text).strip("\n"))

    def parser_lines(self, parser: argparse.ArgumentParser, command: str | None) -> list[str]:
        lines: list[str] = []
        if command:
            lines += ["", f".SH COMMAND {italic(repr_quoted(command))}"]
            lines.append(markup(parser.format_usage().strip("\n")))
        if parser.description:
            lines.append("" if command else ".SH DESCRIPTION")
            lines.append(markup(parser.description.strip("\n")))
        for group in parser._action_groups:
            group_lines = self.group_lines(group, command)
            if group_lines:
                lines += ["", *group_lines]
        return lines

    def group_lines(self, group: argparse._ArgumentGroup, command: str | None) -> list[str]:
        content: list[str] = []
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._SubParsersAction):
                return self.verbs(group, action, command)
            if "--help" in action.option_strings:
                continue
            if content:
                content.append("")
            content += [".TP", self.fmt.invocation(action)]
            if action.help:
                content.append(self.text(self.fmt.help_of(action)))
        if not content:
            return []
        title = GROUP_TITLES.get(group.title or "", group.title)
        head = []
        if title:
            title = title.upper() + (f" {italic(repr_quoted(command))}" if command else "")
            head = [f".SH {title}"]
        if group.description:
            head += [markup(group.description.strip("\n")), ""]
        return head + content

    def verbs(
        self,
        group: argparse._ArgumentGroup,
        action: argparse._SubParsersAction,  # type: ignore[type-arg]
        command: str | None,
    ) -> list[str]:
        title = (group.title or "commands").upper()
        if command:
            title += f" {italic(repr_quoted(command))}"
        listing: list[str] = []
        for choice in action._choices_actions:
            if choice.help == argparse.SUPPRESS:
                continue
            listing += [".TP", f"{bold(command or self.prog)} {italic(choice.dest)}"]
            if choice.help:
                listing.append(markup(choice.help.strip("\n")))
        lines = [".SH", title, "\n".join(listing)]
        hidden = {c.dest for c in action._choices_actions if c.help == argparse.SUPPRESS}
        seen: set[int] = set()
        for name, sub in action.choices.items():
            if id(sub) in seen or name in hidden:  # an alias, or a hidden verb
                continue
            seen.add(id(sub))
            lines += self.parser_lines(sub, f"{command or self.prog} {name}")
        return lines


def repr_quoted(text: str) -> str:
    return f"'{text}'"


def render(
    parser: argparse.ArgumentParser,
    *,
    section: int,
    date: str,
    source: str,
    manual: str,
    summary: str,
    sections: list[tuple[str, str]],
) -> str:
    """The man page of parser; sections: (heading, roff) appended in order."""
    page = _Page(parser)
    synopsis = parser.format_usage().split(":", 1)[-1].split()
    lines = [
        f'.TH {markup(parser.prog.upper())} "{section}" "{markup(date)}" '
        f'"{markup(source)}" "{markup(manual)}"',
        ".SH NAME",
        markup(f"{parser.prog} - {summary}"),
        ".SH SYNOPSIS",
        f".B {markup(synopsis[0])}",
        " ".join(synopsis[1:]),
        *page.parser_lines(parser, None),
    ]
    for heading, content in sections:
        lines += [f".SH {heading.upper()}", content]
    return "\n".join(lines).strip("\n") + "\n"
