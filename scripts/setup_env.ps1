# The Windows counterpart of setup_env.sh, dot-sourced by demo.ps1 and test.ps1 after they set $Extras:
#     $Extras = "plots"; . (Join-Path $PSScriptRoot "setup_env.ps1")
# Creates (or repairs) the virtual environment with Python 3.11 through the `py` launcher and installs
# la-trainer with those extras at the tested versions (constraints.txt). Dot-sourced rather than called,
# so $Root, $Venv and $Python land in the caller's scope with no function output to keep clean.
# Not run on Windows by this project's CI (which is Linux); tests/test_powershell_scripts.py parses it.
$ErrorActionPreference = "Stop"
$Root = Split-Path -Parent $PSScriptRoot
$Venv = if ($env:LA_TRAINER_VENV) { $env:LA_TRAINER_VENV } else { Join-Path $Root ".venv" }
$Python = Join-Path $Venv "Scripts\python.exe"
# A folder without its Scripts\python.exe is made again only when it is a virtual environment (it has
# pyvenv.cfg) or empty: a mistyped LA_TRAINER_VENV that names a real folder is refused, never deleted (the
# rule of setup_env.sh). -LiteralPath: a path with [ ] is not a wildcard that could match another folder.
if ((Test-Path -LiteralPath $Venv) -and -not (Test-Path -LiteralPath $Python)) {
    $IsVenv = Test-Path -LiteralPath (Join-Path $Venv "pyvenv.cfg")
    $IsEmpty = $null -eq (Get-ChildItem -LiteralPath $Venv -Force | Select-Object -First 1)
    if (-not ($IsVenv -or $IsEmpty)) {
        throw "$Venv exists but is not a virtual environment; move it away or set LA_TRAINER_VENV."
    }
    Write-Host "The virtual environment in $Venv is broken; making it again."
    Remove-Item -LiteralPath $Venv -Recurse -Force
}
if (-not (Test-Path -LiteralPath $Python)) {
    py -3.11 -m venv $Venv
    # ${Venv}: a name followed by ':' inside a string is read as a drive-qualified variable (ParserError).
    if ($LASTEXITCODE -ne 0) { throw "Could not create ${Venv}: install Python 3.11 from python.org (with the py launcher)." }
}
& $Python -m pip install --quiet --disable-pip-version-check -c (Join-Path $Root "constraints.txt") -e "$Root[$Extras]"
if ($LASTEXITCODE -ne 0) { throw "pip install failed" }
Set-Location $Root
