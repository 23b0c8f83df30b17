# Pure helpers shared by the flake, the package builder and the NixOS module.
#
# Only builtins here, no nixpkgs: CI (which has Nix but no nixpkgs) evaluates every function in
# this file with `nix-instantiate --eval --strict` (tests/test_nix.py).
let
  schema = builtins.fromJSON (builtins.readFile ../tools/llamanix/data/schema.json);

  # builtins.filter/attrNames/listToAttrs based stand-ins for the lib functions we need.
  filterAttrs =
    pred: set:
    builtins.listToAttrs (
      map (name: {
        inherit name;
        value = set.${name};
      }) (builtins.filter (name: pred name set.${name}) (builtins.attrNames set))
    );
  dropNulls = filterAttrs (_: value: value != null);
  hasInfix = needle: text: builtins.length (builtins.split needle text) > 1;
  hasPrefix = prefix: text: builtins.substring 0 (builtins.stringLength prefix) text == prefix;
  toLower = builtins.replaceStrings (upperChars) (lowerChars);
  lowerChars = builtins.genList (i: builtins.substring i 1 "abcdefghijklmnopqrstuvwxyz") 26;
  upperChars = builtins.genList (i: builtins.substring i 1 "ABCDEFGHIJKLMNOPQRSTUVWXYZ") 26;
in
rec {
  inherit schema dropNulls;

  # The variant names, in the order the schema lists them (the schema is the source of truth).
  variants = schema.instances.variant.values;

  # Which CUDA compute capabilities each package attribute is built for. `llama-cpp-VARIANT` is
  # the RTX 3090 (8.6) plus RTX 5090 (12.0) build; the suffixed ones build one architecture
  # (shorter builds, smaller closures) or none at all.
  archSets = {
    "" = [
      "8.6"
      "12.0"
    ];
    "-sm120" = [ "12.0" ];
    "-sm86" = [ "8.6" ];
    "-cpu" = [ ];
  };

  # packages.<system> attribute name -> { variant; cudaArchs; }
  variantPackages = builtins.listToAttrs (
    builtins.concatMap (
      variant:
      map (suffix: {
        name = "llama-cpp-${variant}${suffix}";
        value = {
          inherit variant;
          cudaArchs = archSets.${suffix};
        };
      }) (builtins.attrNames archSets)
    ) variants
  );

  # The GPU smoke checks (tests/gpu-smoke.nix), one per CUDA package: attribute name ->
  # { package (its packages.<system> name); variant; cudaArchs; }.
  # "gpu-smoke-upstream-sm120" checks llama-cpp-upstream-sm120, "gpu-smoke-upstream" the
  # sm_86 + sm_120 build llama-cpp-upstream.
  gpuSmokeChecks = builtins.listToAttrs (
    map
      (package: {
        name = "gpu-smoke-" + builtins.substring 10 (builtins.stringLength package) package;
        value = variantPackages.${package} // {
          inherit package;
        };
      })
      (
        builtins.filter (package: variantPackages.${package}.cudaArchs != [ ]) (
          builtins.attrNames variantPackages
        )
      )
  );

  # One aggregate per compute capability: "gpu-smoke-sm120" -> the checks of every package
  # with SASS for 12.0, i.e. everything a machine with that card can check.
  gpuSmokeGroups = builtins.listToAttrs (
    map
      (arch: {
        name = "gpu-smoke-sm${builtins.replaceStrings [ "." ] [ "" ] arch}";
        value = builtins.filter (name: builtins.elem arch gpuSmokeChecks.${name}.cudaArchs) (
          builtins.attrNames gpuSmokeChecks
        );
      })
      archSets."");

  # `nix run .#smoke -- VARIANT [ARCH]`: the ARCH words, each naming the package
  # llama-cpp-VARIANT-ARCH (without ARCH: llama-cpp-VARIANT, the sm_86 + sm_120 build).
  smokeArchs = builtins.filter (arch: arch != "") (
    map (suffix: builtins.substring 1 (builtins.stringLength suffix) suffix) (
      builtins.attrNames archSets
    )
  );

  # [ "8.6" "12.0" ] -> "86;120". A suffix stays: "12.0a" -> "120a".
  #
  # Upstream llama.cpp turns a plain 12X into 12Xa itself (Blackwell's FP4 tensor-core
  # instructions only exist in the architecture-specific target). ik_llama.cpp has no such rewrite
  # and no arch-specific kernels, so the same string gives it sm_120 code; either way it must be
  # explicit, because ik's default list (50;61;70;75;80) has no Blackwell code at all.
  cmakeCudaArchitectures =
    cudaArchs: builtins.concatStringsSep ";" (map (builtins.replaceStrings [ "." ] [ "" ]) cudaArchs);

  # Remove every -DNAME... for the given NAMEs, so the builder can set them again without two
  # conflicting definitions on one cmake command line.
  dropCMakeFlags =
    names: flags:
    builtins.filter (
      flag:
      !(
        builtins.isString flag
        && builtins.any (name: hasPrefix "-D${name}:" flag || hasPrefix "-D${name}=" flag) names
      )
    ) flags;

  # Flash-attention kernels for every K/V cache type pair, so a quantized KV cache (q8_0 K with
  # q4_0 V, say) never falls back to the CPU. Newer ggml spells it GGML_CUDA_FA_QUANTS=all (and
  # warns about the old option); older trees and ik_llama.cpp only know GGML_CUDA_FA_ALL_QUANTS.
  # ggmlCMakeLists: the text of the source's ggml/CMakeLists.txt, or null when unknown.
  cudaFaQuantsFlags =
    ggmlCMakeLists:
    if ggmlCMakeLists != null && hasInfix "GGML_CUDA_FA_QUANTS" ggmlCMakeLists then
      [ "-DGGML_CUDA_FA_QUANTS:STRING=all" ]
    else
      [ "-DGGML_CUDA_FA_ALL_QUANTS:BOOL=TRUE" ];

  # llama.cpp's build number must be an integer (it is compiled into `int LLAMA_BUILD_NUMBER`).
  # A GitHub flake input carries no tag, so the numbers of the pinned revisions are recorded here
  # (README.md, "Pins", says where each comes from); any other revision, e.g. after
  # `nix flake update`, reports 0 rather than a wrong number.
  buildNumbers = {
    # ggml-org/llama.cpp master, tag b9187
    "0253fb21f595246f54c192fe8332f34173be251b" = 9187;
    # PR #22673 squash-merged, tag b9180
    "255582687b8dd211fdbc582e43ab842491554e94" = 9180;
    # ik_llama.cpp counts commits (git rev-list --count)
    "de55d9e2f6c24d3f0c8a8a2a296e486b2ccf80b2" = 4743;
    # Anbeeld/beellama.cpp, git rev-list --count (it keeps upstream's history)
    "ba1fdce591f5a845cdbf6642767ecc1f8238519d" = 9353;
  };
  buildNumberOf = rev: buildNumbers.${rev} or 0;

  # "20260516152027" (a flake input's lastModifiedDate) -> "0-unstable-2026-05-16", the nixpkgs
  # convention for untagged sources.
  unstableVersion =
    lastModifiedDate:
    "0-unstable-${builtins.substring 0 4 lastModifiedDate}-${builtins.substring 4 2 lastModifiedDate}-${builtins.substring 6 2 lastModifiedDate}";

  # nixpkgs `config.allowUnfreePredicate` that admits the NVIDIA CUDA licenses and nothing else
  # unfree (the same list the llama.cpp flake uses).
  cudaLicenseNames = [
    "CUDA EULA"
    "cuDNN EULA"
    "cuSPARSELt EULA"
    "cuTENSOR EULA"
    "NVidia OptiX EULA"
  ];
  allowCudaUnfree =
    pkg:
    let
      license = pkg.meta.license or [ ];
    in
    builtins.all (l: (l.free or true) || builtins.elem (l.shortName or "") cudaLicenseNames) (
      if builtins.isList license then license else [ license ]
    );

  # --- Python dependencies: pyproject.toml is the only list ----------------------------------

  # Systems the flake builds for. Anything else gets `unsupportedSystem`'s one line.
  systems = [
    "x86_64-linux"
    "aarch64-linux"
  ];
  unsupportedSystem =
    system:
    "services.llamanix: ${system} is not supported; the llamanix flake builds for ${builtins.concatStringsSep " and " systems}.";

  # python3Packages attribute names that differ from the PEP 503 normalised project name of a
  # pyproject.toml requirement. Today every dependency's attribute is its normalised name, so the
  # map is empty; a dependency whose attribute differs gets an entry here, and tests/test_nix_deps.py
  # fails until it has one.
  pythonAttrOverrides = { };

  # "Prometheus_Client>=0.20" -> "prometheus-client": the project name of a PEP 508
  # requirement, PEP 503 normalised (lower case, runs of - _ . become one -).
  requirementName =
    requirement:
    let
      name = builtins.head (builtins.match "[[:space:]]*([A-Za-z0-9][A-Za-z0-9._-]*).*" requirement);
    in
    toLower (builtins.concatStringsSep "-" (builtins.filter builtins.isString (builtins.split "[-_.]+" name)));

  # The python3Packages attribute of one requirement.
  pythonAttrOf = overrides: requirement: overrides.${requirementName requirement} or (requirementName requirement);

  # pyproject (as lib.importTOML reads it) -> the attribute names of its [project] dependencies,
  # or of one [project.optional-dependencies] group.
  pythonDependencies =
    pyproject: map (pythonAttrOf pythonAttrOverrides) (pyproject.project.dependencies or [ ]);
  pythonOptionalDependencies =
    pyproject: group:
    map (pythonAttrOf pythonAttrOverrides) (pyproject.project.optional-dependencies.${group} or [ ]);

  # --- The NixOS module's JSON: the same shape as llamanix.toml -----------------------------

  # Instance keys the module sets itself rather than offering as options: the host is this
  # machine, the binary is the chosen package's llama-server.
  instanceKeysSetByModule = [
    "host"
    "binary"
  ];
  # Host keys: kind is always "nixos", target is this machine, binaries come from `package`.
  # `gpu`, `cuda_archs` and `gpu_sandbox` are services.llamanix.gpu, services.llamanix.cudaArchs
  # and services.llamanix.gpuSandbox.
  hostKeysSetByModule = [
    "kind"
    "target"
    "binaries"
  ];
  hostKeyOptions = {
    gpu = "gpu";
    cuda_archs = "cudaArchs";
    gpu_sandbox = "gpuSandbox";
  };
  # Router keys the module sets itself: llama-swap's path is its package's.
  routerKeysSetByModule = [ "binary" ];
  # Options of services.llamanix.router that are not schema keys.
  moduleOnlyRouterOptions = [
    "package"
    "openFirewall"
  ];
  # Options of services.llamanix.instances.<name> that are not schema keys.
  moduleOnlyInstanceOptions = [
    "package"
    "cudaArchs"
    "openFirewall"
  ];

  # Keep the schema keys of one table from an option value set, leaving out null (absent: the
  # binary's own default applies, exactly as when the key is missing from llamanix.toml).
  schemaValues =
    table: values:
    dropNulls (
      builtins.listToAttrs (
        map (name: {
          inherit name;
          value = values.${name} or null;
        }) (builtins.attrNames table)
      )
    );

  # One instance as llamanix.toml would hold it. `instance` is the option value set of
  # services.llamanix.instances.<name>; module-only options (package, ...) are left out.
  instanceData =
    {
      host,
      binary,
      instance,
    }:
    builtins.removeAttrs (schemaValues schema.instances instance) instanceKeysSetByModule
    // {
      inherit host binary;
      speculative = schemaValues schema.speculative (instance.speculative or { });
    };

  # The whole config for one NixOS host: { hosts.HOST = ...; instances.NAME = ...; }.
  # instances: NAME -> { binary; instance; }.
  # router: null, or { binary (llama-swap's, or null); router = the option value set }.
  configData =
    {
      host,
      gpu ? null,
      cudaArchs ? [ ],
      gpuSandbox ? null,
      router ? null,
      instances,
    }:
    {
      hosts.${host} = dropNulls {
        kind = "nixos";
        inherit gpu;
        cuda_archs = if cudaArchs == [ ] then null else cudaArchs;
        gpu_sandbox = gpuSandbox;
        router =
          if router == null then
            null
          else
            builtins.removeAttrs (schemaValues schema.router router.router) routerKeysSetByModule
            // dropNulls { inherit (router) binary; };
      };
      instances = builtins.mapAttrs (
        _: i:
        instanceData {
          inherit host;
          inherit (i) binary instance;
        }
      ) instances;
    };

  # llamanix.toml -> `services.llamanix` settings for one host, so the file `llamanix switch`
  # edits is the one the NixOS configuration is built from:
  #   services.llamanix = llamanix.lib.fromToml ./llamanix.toml "gpu1" // { enable = true; };
  # The host table's `gpu`, `cuda_archs` and `gpu_sandbox` become the module's `gpu`, `cudaArchs`
  # and `gpuSandbox` (left out when the table has none, so the module's defaults apply); `kind`,
  # `target` and `binaries` describe how other hosts are reached and have no meaning inside the
  # module (hostKeysSetByModule). [defaults] is merged under each instance (speculative key by key),
  # instances of other hosts are dropped, and `host`/`binary` (set by the module) are removed.
  fromToml =
    path: host:
    let
      config = builtins.fromTOML (builtins.readFile path);
      hostTable = (config.hosts or { }).${host} or { };
      settings = dropNulls (
        builtins.listToAttrs (
          map (key: {
            name = hostKeyOptions.${key};
            value = hostTable.${key} or null;
          }) (builtins.attrNames hostKeyOptions)
        )
      );
    in
    settings
    // {
      instances = instancesFromToml path host;
    }
    // (
      # [hosts.HOST.router] is services.llamanix.router, less what the module sets itself.
      if hostTable ? router then
        { router = builtins.removeAttrs hostTable.router routerKeysSetByModule; }
      else
        { }
    );

  # Only the instances: `services.llamanix.instances = llamanix.lib.instancesFromToml ./llamanix.toml "gpu1";`
  instancesFromToml =
    path: host:
    let
      config = builtins.fromTOML (builtins.readFile path);
      defaults = config.defaults or { };
      hosts = builtins.attrNames (config.hosts or { });
      onHost =
        _: instance:
        (instance.host or (if builtins.length hosts == 1 then builtins.head hosts else host)) == host;
      merge =
        _: instance:
        builtins.removeAttrs (
          defaults
          // instance
          // {
            speculative = (defaults.speculative or { }) // (instance.speculative or { });
          }
        ) instanceKeysSetByModule;
    in
    builtins.mapAttrs merge (filterAttrs onHost (config.instances or { }));
}
