# The README's demo command on Windows (PowerShell): powershell -ExecutionPolicy Bypass -File scripts\demo.ps1
# Creates or reuses .venv with Python 3.11+ (the `py` launcher), installs la-trainer with the plots extra
# and the tested versions, and runs the demo. Arguments go to `la-trainer demo` (e.g. --quick).
# Not run on Windows by this project's CI (which is Linux): kept to these few plain steps on purpose.
$ErrorActionPreference = "Stop"
$Root = Split-Path -Parent $PSScriptRoot
$Venv = if ($env:LA_TRAINER_VENV) { $env:LA_TRAINER_VENV } else { Join-Path $Root ".venv" }
$Python = Join-Path $Venv "Scripts\python.exe"
if ((Test-Path $Venv) -and -not (Test-Path $Python)) {
    Write-Host "The virtual environment in $Venv is broken; making it again."
    Remove-Item -Recurse -Force $Venv
}
if (-not (Test-Path $Python)) {
    py -3.11 -m venv $Venv
    if ($LASTEXITCODE -ne 0) { throw "Could not create $Venv: install Python 3.11 from python.org (with the py launcher)." }
}
& $Python -m pip install --quiet --disable-pip-version-check -c (Join-Path $Root "constraints.txt") -e "$Root[plots]"
if ($LASTEXITCODE -ne 0) { throw "pip install failed" }
Set-Location $Root
& $Python -m trainer demo @args
exit $LASTEXITCODE
