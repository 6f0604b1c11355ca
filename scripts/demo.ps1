# The README's demo command on Windows (PowerShell): powershell -ExecutionPolicy Bypass -File scripts\demo.ps1
# Creates or reuses .venv with Python 3.11+ (the `py` launcher), installs la-trainer with the plots extra
# and the tested versions (setup_env.ps1), and runs the demo. Arguments go to `la-trainer demo` (e.g. --quick).
# Not run on Windows by this project's CI (which is Linux): tests/test_powershell_scripts.py parses it.
$ErrorActionPreference = "Stop"
$Arguments = $args  # taken before dot-sourcing, which runs another script in this scope
$Extras = "plots"
. (Join-Path $PSScriptRoot "setup_env.ps1")
& $Python -m trainer demo @Arguments
exit $LASTEXITCODE
