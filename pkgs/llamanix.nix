# The llamanix command (tools/llamanix, packaged from the repository's pyproject.toml).
{
  lib,
  python3Packages,
  src,
}:
let
  pyproject = lib.importTOML (src + "/pyproject.toml");
  # pyproject.toml's [project] dependencies, as nixpkgs Python packages.
  runtimeDeps =
    ps: with ps; [
      click
      gguf
      httpx
      jinja2
      numpy
      prometheus-client
      rich
    ];
in
python3Packages.buildPythonApplication {
  pname = "llamanix";
  inherit (pyproject.project) version;
  pyproject = true;
  inherit src;

  build-system = [ python3Packages.setuptools ];

  dependencies = runtimeDeps python3Packages;

  # The test suite runs a real llama-server (built from a pinned sdist it downloads) and
  # systemd-analyze; neither fits a sandboxed build. CI runs it. What the build does check is
  # that the installed command starts and carries its data files.
  doCheck = false;
  pythonImportsCheck = [ "llamanix" ];
  doInstallCheck = true;
  installCheckPhase = ''
    runHook preInstallCheck
    $out/bin/llamanix --version
    $out/bin/llamanix schema --json > /dev/null
    runHook postInstallCheck
  '';

  # For the development shell: the same list for another Python package set.
  passthru = { inherit runtimeDeps; };

  meta = {
    description = "Build, serve, switch, measure and roll back llama.cpp variants as hardened llama-server services";
    license = lib.licenses.mit;
    mainProgram = "llamanix";
    platforms = lib.platforms.linux;
  };
}
