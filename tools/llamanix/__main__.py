from llamanix.cli import main

# The same program name as the installed command: help, errors and shell completion
# (_LLAMANIX_COMPLETE) read the same under `python -m llamanix`.
main(prog_name="llamanix")
