# The llamanix command (tools/llamanix, packaged from the repository's pyproject.toml).
{
  lib,
  python3Packages,
  src,
}:
let
  llamanixLib = import ../nix/lib.nix;
  pyproject = lib.importTOML (src + "/pyproject.toml");
  # pyproject.toml is the one list of dependencies: adding one there adds it here.
  attrsOf =
    names: ps:
    map (
      name:
      ps.${name}
        or (throw "llamanix: pyproject.toml names '${name}', which python3Packages lacks; map it in nix/lib.nix pythonAttrOverrides")
    ) names;
  runtimeDeps = attrsOf (llamanixLib.pythonDependencies pyproject);
  # An optional-dependencies group (plot, test) for another Python package set.
  optionalDeps = group: attrsOf (llamanixLib.pythonOptionalDependencies pyproject group);
  # One command of every CLI group, so a dependency imported only inside a command is loaded.
  helpChecks = [
    "plan"
    "switch"
    "bench"
    "doctor"
    "testbed"
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
    for command in ${lib.escapeShellArgs helpChecks}; do
      $out/bin/llamanix "$command" --help > /dev/null
    done
    # Every module imports with only the declared dependencies.
    PYTHONPATH="$out/${python3Packages.python.sitePackages}''${PYTHONPATH:+:$PYTHONPATH}" \
      ${python3Packages.python.interpreter} -c 'import importlib, pkgutil, llamanix
    for m in pkgutil.walk_packages(llamanix.__path__, "llamanix."):
        importlib.import_module(m.name)'
    runHook postInstallCheck
  '';

  # For the development shell: the same list for another Python package set.
  passthru = { inherit runtimeDeps optionalDeps helpChecks; };

  meta = {
    description = "Build, serve, switch, measure and roll back llama.cpp variants as hardened llama-server services";
    license = lib.licenses.mit;
    mainProgram = "llamanix";
    platforms = lib.platforms.linux;
  };
}
