"""Shell completion of the names a running santhrottled knows: resources, groups, initiators.

What it owns
    complete_names(action, kind): marks an argparse argument as taking the
    names of `kind` (resources, groups, initiators); the build's shtab
    (buildsys/santhrottle_build.py) renders the mark as a call to the shell
    function _santhrottle_<kind>.  PREAMBLE: those functions, for bash and
    zsh, prepended to the generated completion scripts.  Each asks the
    daemon through `santhrottle names KIND` (cli/names.py), passing on a
    --socket or --config already on the command line, with a short timeout;
    no daemon, or a socket the user may not open: no names, nothing printed.

    `threshold set RESOURCE VALUE` takes its operands as one REMAINDER: only
    the first is completed.  bash splits words at ":" (COMP_WORDBREAKS): an
    IPv6 address completes from what precedes its first colon.

    This module imports nothing: the build reads it from the source tree.

Worked example
    santhrottle threshold reset v<TAB>   -> santhrottle names resources --timeout 2
                                            -> vg0 vg1 -> "vg0 vg1" offered
    santhrottle pin fd<TAB>              -> fd00::3
"""

from __future__ import annotations

from typing import Any

KINDS = ("resources", "groups", "initiators")
# Seconds the completion waits for the daemon (a shell user waits for the answer).
COMPLETION_TIMEOUT_S = 2
THRESHOLD_OPERAND = "threshold_resource"  # the first operand of `threshold set`
# The options of `threshold set` that take a value (cli/daemon.py, socket_options).
VALUED = "--socket|--config|--timeout"


def complete_names(action: Any, kind: str) -> Any:
    """Mark an argparse action as completed with the daemon's names of `kind`."""
    assert kind in (*KINDS, THRESHOLD_OPERAND), kind
    fn = f"_santhrottle_{kind}"
    action.complete = {"bash": fn, "zsh": fn}
    return action


_BASH = f"""\
# The names santhrottled knows (santhrottle names KIND) that begin with the word being
# completed ($2); a --socket or --config on the line is passed on.
_santhrottle_names() {{
  local i opts=()
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${{COMP_WORDS[i]}}" in
      --socket|--config) opts+=("${{COMP_WORDS[i]}}" "${{COMP_WORDS[i+1]}}") ;;
    esac
  done
  compgen -W "$(command santhrottle names "$1" --timeout {COMPLETION_TIMEOUT_S} "${{opts[@]}}" \
    2>/dev/null)" -- "$2"
}}
_santhrottle_resources() {{ _santhrottle_names resources "$1"; }}
_santhrottle_groups() {{ _santhrottle_names groups "$1"; }}
_santhrottle_initiators() {{ _santhrottle_names initiators "$1"; }}
# `threshold set RESOURCE VALUE`: a resource for the first operand only
_santhrottle_{THRESHOLD_OPERAND}() {{
  local i
  for ((i = COMP_CWORD - 1; i > 0; i--)); do
    case "${{COMP_WORDS[i]}}" in
      set) break ;;
      -*) continue ;;
    esac
    case "${{COMP_WORDS[i-1]}}" in
      {VALUED}) continue ;;
    esac
    return 0
  done
  _santhrottle_names resources "$1"
}}
"""

_ZSH = f"""\
# The names santhrottled knows (santhrottle names KIND); a --socket or --config on
# the line is passed on.
_santhrottle_names() {{
  local -a opts names
  local i
  for ((i = 1; i < CURRENT; i++)); do
    case ${{words[i]}} in
      --socket|--config) opts+=(${{words[i]}} ${{(Q)words[i+1]}}) ;;
    esac
  done
  names=(${{(f)"$(command santhrottle names $1 --timeout {COMPLETION_TIMEOUT_S} $opts \
    2>/dev/null)"}})
  compadd -a names
}}
_santhrottle_resources() {{ _santhrottle_names resources }}
_santhrottle_groups() {{ _santhrottle_names groups }}
_santhrottle_initiators() {{ _santhrottle_names initiators }}
# `threshold set RESOURCE VALUE`: a resource for the first operand only
_santhrottle_{THRESHOLD_OPERAND}() {{
  local i
  for ((i = CURRENT - 1; i > 0; i--)); do
    case ${{words[i]}} in
      set) break ;;
      -*) continue ;;
    esac
    case ${{words[i-1]}} in
      {VALUED}) continue ;;
    esac
    return 0
  done
  _santhrottle_names resources
}}
"""

PREAMBLE = {"bash": _BASH, "zsh": _ZSH}
