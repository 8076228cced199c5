"""Shell completion scripts for bash, zsh and fish, generated from the argparse parser.

Generated, not hand-kept: a subcommand or option added to the parser is completed without touching
this file. Runbook, scenario and probe names are asked of `runbook list|scenarios|probes --json` at
completion time (so RUNBOOK_PATH and ./runbooks count); the scripts read the `"name"` keys of those
top-level JSON lists, which is why the listings are printed with indent=2.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

SHELLS = ("bash", "zsh", "fish")

# What a value is completed with: a listing of names, files, or fixed choices.
_NAMES_BY_DEST = {"runbook": "list", "files": "list", "simulate": "scenarios", "scenario": "scenarios", "name": "probes"}


@dataclass
class _Option:
    flags: list[str]
    help: str
    takes_value: bool
    choices: list[str] = field(default_factory=list)
    names: str | None = None  # "list" | "scenarios" | "probes": names from `runbook <names> --json`
    files: bool = False


@dataclass
class _Command:
    name: str
    help: str
    options: list[_Option]
    positional: _Option | None  # what the first positional argument is completed with


def _describe(action: argparse.Action) -> _Option:
    metavar = str(action.metavar or "")
    return _Option(
        flags=list(action.option_strings),
        help=" ".join((action.help or "").replace("%(default)s", "…").split()),
        takes_value=action.nargs != 0,
        choices=[str(c) for c in action.choices or getattr(action, "completions", None) or []],
        names=_NAMES_BY_DEST.get(action.dest),
        files=any(word in metavar for word in ("FILE", "PATH", "DIR", ".json", ".md")),
    )


def commands(parser: argparse.ArgumentParser) -> list[_Command]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    helps = {a.dest: a.help or "" for a in sub._choices_actions}  # noqa: SLF001
    out = []
    for name, p in sub.choices.items():
        options = [_describe(a) for a in p._actions if a.option_strings and a.dest != "help"]  # noqa: SLF001
        positionals = [_describe(a) for a in p._actions if not a.option_strings]  # noqa: SLF001
        out.append(_Command(name, helps.get(name, ""), options, positionals[0] if positionals else None))
    return out


def _words(opt: _Option) -> str:
    return " ".join(opt.choices)


# 4 spaces: the "name" keys of the top-level entries, not of nested ones (a probe's params)
_NAMES = (
    "command runbook \"$1\" --json 2>/dev/null | sed -n 's/^    \"name\": \"\\(.*\\)\",\\{0,1\\}$/\\1/p'"
)


def bash(parser: argparse.ArgumentParser) -> str:
    cmds = commands(parser)
    lines = [
        "# bash completion for runbook. Load it with: eval \"$(runbook completion bash)\"",
        "# or save it as ~/.local/share/bash-completion/completions/runbook",
        f"_runbook_names() {{ {_NAMES}; }}",
        "_runbook() {",
        "    local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"${COMP_WORDS[COMP_CWORD-1]}\" cmd=\"${COMP_WORDS[1]}\"",
        "    if [[ $COMP_CWORD -eq 1 ]]; then",
        f"        COMPREPLY=($(compgen -W \"{' '.join(c.name for c in cmds)} --version --help\" -- \"$cur\")); return",
        "    fi",
        "    case \"$cmd\" in",
    ]
    for c in cmds:
        lines.append(f"    {c.name})")
        lines.append("        case \"$prev\" in")
        for o in c.options:
            if not o.takes_value:
                continue
            if o.choices:
                action = f"COMPREPLY=($(compgen -W \"{_words(o)}\" -- \"$cur\"))"
            elif o.names:
                action = f"COMPREPLY=($(compgen -W \"$(_runbook_names {o.names})\" -- \"$cur\"))"
            elif o.files:
                action = "COMPREPLY=($(compgen -f -- \"$cur\"))"
            else:
                action = "COMPREPLY=()"
            lines.append(f"            {'|'.join(o.flags)}) {action}; return;;")
        lines.append("        esac")
        flags = " ".join(f for o in c.options for f in o.flags) + " --help"
        lines.append(f"        if [[ \"$cur\" == -* ]]; then COMPREPLY=($(compgen -W \"{flags}\" -- \"$cur\")); return; fi")
        pos = c.positional
        if pos is not None and pos.choices:
            lines.append(f"        COMPREPLY=($(compgen -W \"{_words(pos)}\" -- \"$cur\"))")
        elif pos is not None and pos.names:
            lines.append(f"        COMPREPLY=($(compgen -W \"$(_runbook_names {pos.names})\" -- \"$cur\"))")
        elif pos is not None:
            lines.append("        COMPREPLY=($(compgen -f -- \"$cur\"))")
        lines.append("        ;;")
    lines += ["    esac", "}", "complete -o default -F _runbook runbook", ""]
    return "\n".join(lines)


def _zq(text: str) -> str:
    """A zsh single-quoted word."""
    return "'" + text.replace("'", "'\\''") + "'"


def zsh(parser: argparse.ArgumentParser) -> str:
    cmds = commands(parser)
    described = " ".join(_zq(f"{c.name}:{c.help.replace(':', chr(92) + ':')}") for c in cmds)
    lines = [
        "#compdef runbook",
        "# zsh completion for runbook. Load it with: source <(runbook completion zsh)  (after compinit)",
        "# or save it as _runbook in a directory of your $fpath",
        f"_runbook_names() {{ {_NAMES}; }}",
        "_runbook() {",
        f"    local -a subcommands; subcommands=({described})",
        "    if (( CURRENT == 2 )); then _describe 'command' subcommands; return; fi",
        "    local cmd=$words[2] prev=$words[CURRENT-1]",
        "    case $cmd in",
    ]
    for c in cmds:
        lines.append(f"    {c.name})")
        lines.append("        case $prev in")
        for o in c.options:
            if not o.takes_value:
                continue
            if o.choices:
                action = f"compadd -- {_words(o)}"
            elif o.names:
                action = f"compadd -- ${{(f)\"$(_runbook_names {o.names})\"}}"
            elif o.files:
                action = "_files"
            else:
                action = ":"
            lines.append(f"            {'|'.join(o.flags)}) {action}; return;;")
        lines.append("        esac")
        flags = " ".join(f for o in c.options for f in o.flags) + " --help"
        lines.append(f"        if [[ $PREFIX == -* ]]; then compadd -- {flags}; return; fi")
        pos = c.positional
        if pos is not None and pos.choices:
            lines.append(f"        compadd -- {_words(pos)}")
        elif pos is not None and pos.names:
            lines.append(f"        compadd -- ${{(f)\"$(_runbook_names {pos.names})\"}}")
            if pos.names == "list":
                lines.append("        _files -g '*.y(a|)ml'")
        elif pos is not None:
            lines.append("        _files")
        lines.append("        ;;")
    lines += ["    esac", "}", "compdef _runbook runbook", ""]
    return "\n".join(lines)


def _fq(text: str) -> str:
    """A fish single-quoted word."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def fish(parser: argparse.ArgumentParser) -> str:
    cmds = commands(parser)
    names = " ".join(c.name for c in cmds)
    lines = [
        "# fish completion for runbook. Load it with: runbook completion fish | source",
        "# or save it as ~/.config/fish/completions/runbook.fish",
        f"function __runbook_names; {_NAMES.replace('$1', '$argv[1]')}; end",
        "complete -c runbook -f",
        f"complete -c runbook -n 'not __fish_seen_subcommand_from {names}' -l version -d 'print the version and exit'",
    ]
    for c in cmds:
        lines.append(f"complete -c runbook -n 'not __fish_seen_subcommand_from {names}' -a {c.name} -d {_fq(c.help)}")
        when = f"-n '__fish_seen_subcommand_from {c.name}'"
        for o in c.options:
            flags = " ".join(f"-l {f[2:]}" if f.startswith("--") else f"-s {f[1:]}" for f in o.flags)
            if not o.takes_value:
                value = ""
            elif o.choices:
                value = f" -x -a {_fq(_words(o))}"
            elif o.names:
                value = f" -x -a '(__runbook_names {o.names})'"
            elif o.files:
                value = " -r -F"
            else:
                value = " -x"
            lines.append(f"complete -c runbook {when} {flags}{value} -d {_fq(o.help)}")
        pos = c.positional
        if pos is not None and pos.choices:
            lines.append(f"complete -c runbook {when} -a {_fq(_words(pos))}")
        elif pos is not None and pos.names:
            lines.append(f"complete -c runbook {when} -a '(__runbook_names {pos.names})'" + (" -F" if pos.names == "list" else ""))
        elif pos is not None:
            lines.append(f"complete -c runbook {when} -F")
    return "\n".join(lines) + "\n"


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    return {"bash": bash, "zsh": zsh, "fish": fish}[shell](parser)
