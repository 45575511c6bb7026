# SPDX-License-Identifier: Apache-2.0
# bash completion for cumemguard: subcommands, their options and values, option names for -e and
# --env (read from `cumemguard config`, so they are the installed tool's own), logs for report.
_cumemguard_option_names() {
  "$1" config 2>/dev/null | sed -n 's/^\(CUMEMGUARD_[A-Z0-9_]*\)=.*/\1=/p'
}

_cumemguard() {
  local cur prev cmd i
  COMPREPLY=()
  cur=${COMP_WORDS[COMP_CWORD]}
  prev=${COMP_WORDS[COMP_CWORD-1]}
  cmd=
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${COMP_WORDS[i]} in
      run|report|config|version|help) cmd=${COMP_WORDS[i]}; break ;;
    esac
  done
  if [ -z "$cmd" ]; then
    COMPREPLY=($(compgen -W "run report config version help --help --version" -- "$cur"))
    return
  fi
  case $cmd in
    run)
      # After the program name (or --), complete as for the program itself.
      for ((i = i + 1; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
          --) COMPREPLY=($(compgen -c -- "$cur")); return ;;
          --log|--mode|--stacks|--suppressions|--error-exitcode|-e) ((i++)) ;;
          -*) ;;
          *) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        esac
      done
      case $prev in
        --mode) COMPREPLY=($(compgen -W "guard report strict" -- "$cur")); return ;;
        --log|--suppressions) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        --stacks|--error-exitcode) return ;;
        -e) compopt -o nospace 2>/dev/null
            COMPREPLY=($(compgen -W "$(_cumemguard_option_names "${COMP_WORDS[0]}")" -- "$cur"))
            return ;;
      esac
      if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "--log --no-log --mode --stacks --suppressions --brief --no-summary
                               --error-exitcode --fail-on-leaks -e --help --version --" -- "$cur"))
      else
        COMPREPLY=($(compgen -c -- "$cur"))
      fi
      ;;
    report)
      case $prev in
        --trace) COMPREPLY=($(compgen -f -- "$cur")); return ;;
        --top|--slow-us) return ;;
      esac
      if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "--json --trace --no-symbolize --top --fail-on-leaks --slow-us
                               --help --version" -- "$cur"))
      else
        COMPREPLY=($(compgen -f -X '!*.log*' -- "$cur") $(compgen -d -- "$cur"))
      fi
      ;;
    config)
      if [ "$prev" = "--env" ]; then
        compopt -o nospace 2>/dev/null
        COMPREPLY=($(compgen -W "$(_cumemguard_option_names "${COMP_WORDS[0]}")
                                 PYTORCH_CUDA_ALLOC_CONF= PYTORCH_ALLOC_CONF=
                                 PYTORCH_HIP_ALLOC_CONF=" -- "$cur"))
        return
      fi
      COMPREPLY=($(compgen -W "--json --run --env --help --version" -- "$cur"))
      ;;
  esac
}
complete -F _cumemguard cumemguard
