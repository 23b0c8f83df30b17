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
  range = lo: hi: if hi > lo then builtins.genList (i: lo + i) (hi - lo) else [ ];
  chars = text: builtins.genList (i: builtins.substring i 1 text) (builtins.stringLength text);
  lowerChars = builtins.genList (i: builtins.substring i 1 "abcdefghijklmnopqrstuvwxyz") 26;
  upperChars = builtins.genList (i: builtins.substring i 1 "ABCDEFGHIJKLMNOPQRSTUVWXYZ") 26;
  toUpper = builtins.replaceStrings (lowerChars) (upperChars);
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

  # The default of services.llamanix.cudaArchs. nixpkgs' own `config.cudaCapabilities`, where
  # the system sets it: what every other CUDA package of it is built for, the GPUs the user
  # named (an A100's 8.0, a T4's 7.5), which [ "8.6" "12.0" ] would leave without a kernel
  # image. Else llamanix's RTX 3090 + RTX 5090 build on a host that runs the NVIDIA driver,
  # else the CPU: a CUDA build takes hours. nixpkgs declares the setting with [ ] for unset.
  defaultCudaArchs =
    {
      cudaCapabilities ? null,
      nvidiaEnabled ? false,
    }:
    if cudaCapabilities != null && cudaCapabilities != [ ] then
      cudaCapabilities
    else if nvidiaEnabled then
      archSets.""
    else
      [ ];

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
  # (docs/pins.md says where each comes from); any other revision, e.g. after
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

  # --- CUDA capabilities and the CUDA releases that compile them ---------------------------
  #
  # nixpkgs' own CUDA database is the source: `pkgs._cuda.db.cudaCapabilityToInfo`
  # (pkgs/development/cuda-modules/_cuda/db/bootstrap/cuda.nix), which the package builder reads
  # wherever the nixpkgs it is built with has one. This copy of its values is for a nixpkgs
  # without it (an older one, through the overlay) and for CI, which has no nixpkgs;
  # tests/data/nixpkgs-cuda-capabilities.json records the nixpkgs file it was taken from, and
  # tests/test_nix.py keeps the two equal. Capability -> { archName; minCudaMajorMinorVersion;
  # maxCudaMajorMinorVersion (the last release that compiles it, or null); isJetson; }.
  cudaCapabilities =
    let
      cap = archName: min: max: isJetson: {
        inherit archName isJetson;
        minCudaMajorMinorVersion = min;
        maxCudaMajorMinorVersion = max;
      };
      blackwell = min: cap "Blackwell" min null false;
      thor = min: max: cap "Blackwell" min max true;
    in
    {
      "3.5" = cap "Kepler" "10.0" "11.8" false;
      "3.7" = cap "Kepler" "10.0" "11.8" false;
      "5.0" = cap "Maxwell" "10.0" "12.9" false;
      "5.2" = cap "Maxwell" "10.0" "12.9" false;
      "6.0" = cap "Pascal" "10.0" "12.9" false;
      "6.1" = cap "Pascal" "10.0" "12.9" false;
      "7.0" = cap "Volta" "10.0" "12.9" false;
      "7.2" = cap "Volta" "10.0" "12.2" true;
      "7.5" = cap "Turing" "10.0" null false;
      "8.0" = cap "Ampere" "11.2" null false;
      "8.6" = cap "Ampere" "11.2" null false;
      "8.7" = cap "Ampere" "11.4" null true;
      "8.9" = cap "Ada" "11.8" null false;
      "9.0" = cap "Hopper" "11.8" null false;
      "9.0a" = cap "Hopper" "12.0" null false;
      "10.0" = blackwell "12.7";
      "10.0a" = blackwell "12.7";
      "10.0f" = blackwell "12.9";
      "10.1" = thor "12.7" "12.9";
      "10.1a" = thor "12.7" "12.9";
      "10.1f" = thor "12.9" "12.9";
      "10.3" = blackwell "12.9";
      "10.3a" = blackwell "12.9";
      "10.3f" = blackwell "12.9";
      "11.0" = thor "13.0" null;
      "11.0a" = thor "13.0" null;
      "11.0f" = thor "13.0" null;
      "12.0" = blackwell "12.8";
      "12.0a" = blackwell "12.8";
      "12.0f" = blackwell "12.9";
      "12.1" = blackwell "12.9";
      "12.1a" = blackwell "12.9";
      "12.1f" = blackwell "12.9";
    };

  # "cudaPackages_12_9" for "12.9".
  cudaPackagesAttr = release: "cudaPackages_" + builtins.replaceStrings [ "." ] [ "_" ] release;

  # Why a package of `cudaArchs` cannot be built: [ ] when it can, else one sentence per problem,
  # each naming the fix, so a mismatch stops the evaluation rather than nvcc hours later.
  #   capabilities: nixpkgs' cudaCapabilityToInfo (or cudaCapabilities above);
  #   cudaVersion: cudaPackages' major.minor; system: the host platform's;
  #   jetsonPackages: whether these cudaPackages are Jetson's (nixpkgs picks them only from its
  #   global config.cudaCapabilities).
  # The rules are nixpkgs' own: a capability is supported from its first release to its last,
  # inclusive (_cuda.lib._cudaCapabilityIsSupported), and Jetson capabilities are built only on
  # aarch64-linux and never beside others (_cuda/lib/flags.nix).
  cudaArchProblems =
    {
      capabilities,
      cudaVersion,
      cudaArchs,
      system,
      jetsonPackages ? false,
    }:
    let
      older = a: b: builtins.compareVersions a b < 0;
      known = builtins.sort older (builtins.attrNames capabilities);
      info = arch: capabilities.${arch} or null;
      isJetson = arch: (info arch).isJetson or false;
      jetson = builtins.filter isJetson cudaArchs;
      others = builtins.filter (arch: !(isJetson arch)) cudaArchs;
      list = builtins.concatStringsSep ", ";
      release =
        arch:
        let
          i = info arch;
          max = i.maxCudaMajorMinorVersion or null;
          isThor = builtins.substring 0 4 arch == "10.1";
        in
        if i == null then
          "compute capability ${arch} is not one nixpkgs' CUDA packages know (known: ${list known})"
        else if older cudaVersion i.minCudaMajorMinorVersion then
          "compute capability ${arch} (${i.archName}) needs CUDA ${i.minCudaMajorMinorVersion} or newer, this nixpkgs has cudaPackages ${cudaVersion}; use .override { cudaPackages = ${cudaPackagesAttr i.minCudaMajorMinorVersion}; } (or newer)"
        else if max != null && older max cudaVersion then
          if isThor then
            "compute capability ${arch} (${i.archName}, Jetson Thor) is called 11.0${builtins.substring 4 1 arch} from CUDA 13.0 on, and this nixpkgs has cudaPackages ${cudaVersion}; write \"11.0${builtins.substring 4 1 arch}\" instead"
          else
            "compute capability ${arch} (${i.archName}) was dropped after CUDA ${max}, and this nixpkgs has cudaPackages ${cudaVersion}; use .override { cudaPackages = ${cudaPackagesAttr max}; }"
        else
          null;
      quoted = builtins.concatStringsSep " " (map (a: "\"${a}\"") jetson);
      jetsonProblems =
        if jetson == [ ] then
          [ ]
        else if system != "aarch64-linux" then
          [
            "Jetson compute capabilities (${list jetson}) are built only for aarch64-linux, and this is ${system}; build them for the Jetson"
          ]
        else if others != [ ] then
          [
            "Jetson compute capabilities (${list jetson}) cannot be built together with others (${list others}): nixpkgs' CUDA packages for Jetson are not those of other GPUs; build them as separate packages"
          ]
        else if !jetsonPackages then
          [
            "Jetson compute capabilities (${list jetson}) need nixpkgs' Jetson CUDA packages, which it picks only when its own config.cudaCapabilities names Jetson capabilities; set nixpkgs.config.cudaCapabilities = [ ${quoted} ] and services.llamanix.useSystemNixpkgs = true"
          ]
        else
          [ ];
    in
    builtins.filter (p: p != null) (map release cudaArchs) ++ jetsonProblems;

  # The unfree licenses CUDA packages carry, as nixpkgs' _cuda.lib.allowUnfreeCudaPredicate
  # admits them, for a nixpkgs without _cuda (flake.nix): every license of lib.licenses whose
  # name starts with "nvidia" (nvidiaCuda, nvidiaCudaRedist, ...), by short name.
  # licenses: lib.licenses.
  nvidiaLicenseNames =
    licenses:
    builtins.foldl' (acc: name: if builtins.elem name acc then acc else acc ++ [ name ]) [ ] (
      builtins.filter (name: name != null) (
        map (name: licenses.${name}.shortName or null) (
          builtins.filter (name: hasPrefix "nvidia" name && builtins.isAttrs licenses.${name}) (
            builtins.attrNames licenses
          )
        )
      )
    );
  # package -> whether each of its licenses is free or one of those.
  cudaLicensePredicate =
    licenses: package:
    let
      names = nvidiaLicenseNames licenses;
      license = package.meta.license or [ ];
    in
    builtins.all (l: (l.free or false) || builtins.elem (l.shortName or null) names) (
      if builtins.isList license then license else [ license ]
    );

  # --- The NixOS module's checks that need no build ------------------------------------------

  # Python's difflib.get_close_matches(word, choices, n = 1, cutoff = 0.6), which llamanix's "did
  # you mean" uses, so that the module's assertions say what the generator says: the choice
  # whose similarity ratio 2 * M / (its length + the word's length) is highest and at least 0.6,
  # M being the characters of SequenceMatcher's matching blocks (the longest common block,
  # earliest in the choice, then earliest in the word, then recursively left and right of it);
  # of two equal ratios, the greater string. null when none is close.
  closeMatch =
    word: choices:
    let
      matched =
        a: b:
        let
          at = builtins.elemAt;
          count =
            alo: ahi: blo: bhi:
            let
              run = i: j: if i < ahi && j < bhi && at a i == at b j then 1 + run (i + 1) (j + 1) else 0;
              best = builtins.foldl' (
                acc: i:
                builtins.foldl' (
                  acc: j:
                  let
                    k = run i j;
                  in
                  if k > acc.k then { inherit i j k; } else acc
                ) acc (range blo bhi)
              ) { k = 0; } (range alo ahi);
            in
            if best.k == 0 then
              0
            else
              best.k + count alo best.i blo best.j + count (best.i + best.k) ahi (best.j + best.k) bhi;
        in
        count 0 (builtins.length a) 0 (builtins.length b);
      scored = map (choice: {
        inherit choice;
        m = matched (chars choice) (chars word);
        t = builtins.stringLength choice + builtins.stringLength word;
      }) choices;
      close = builtins.filter (s: s.t > 0 && 10 * s.m >= 3 * s.t) scored;
      better = x: y: x.m * y.t > y.m * x.t || (x.m * y.t == y.m * x.t && y.choice < x.choice);
      best = builtins.foldl' (acc: s: if acc == null || better s acc then s else acc) null close;
    in
    if best == null then null else best.choice;

  # llamanix's hint after an unknown name: "did you mean 'x'?", else the names it knows.
  suggest =
    word: choices:
    let
      close = closeMatch word choices;
    in
    if close != null then
      "did you mean '${close}'?"
    else
      "known: ${builtins.concatStringsSep ", " choices}";

  # The router's mistakes that evaluation can see, each in the words `llamanix render` would use
  # at build time (config/model.py, render/units.py), so `nixos-rebuild` stops before building.
  # router: services.llamanix.router (or null); instanceNames: the instances' names.
  routerProblems =
    { router, instanceNames }:
    if router == null then
      [ ]
    else
      map (
        name: "services.llamanix.router.members: no instance '${name}' (${suggest name instanceNames})"
      ) (builtins.filter (name: !(builtins.elem name instanceNames)) router.members)
      ++ (
        if router.kind == "llama-swap" && (router.api_key_file or null) != null then
          [
            "services.llamanix.router.api_key_file: a llama-swap router cannot take a key file yet (its apiKeys would put the key into its config) (leave it out and keep the router on loopback, or use kind = \"llama-server\")"
          ]
        else
          [ ]
      );

  # Whether a listen address is this machine's loopback (core/address.py's is_loopback).
  isLoopback =
    listen:
    builtins.elem (toLower listen) [
      "localhost"
      "localhost."
      "::1"
      "[::1]"
    ]
    || hasPrefix "127." listen;

  # Firewall settings that open nothing useful: a port opened for a loopback listener (an
  # instance's, the router's or the gateway's), and openFirewall on a router's member, whose port
  # is internal. And the opposite: a listener beyond loopback whose port the firewall keeps
  # closed, so that no other machine (another host's gateway, say) reaches it.
  # instances: NAME -> { listen; port; openFirewall; }; router: services.llamanix.router or
  # null; gateway: services.llamanix.gateway or null; firewall: networking.firewall (null:
  # unknown, nothing is said of closed ports).
  firewallWarnings =
    {
      instances,
      router,
      gateway ? null,
      firewall ? null,
    }:
    let
      members = if router == null then [ ] else router.members;
      opened = filterAttrs (_: inst: inst.openFirewall or false) instances;
      routed = builtins.filter (name: builtins.elem name members) (builtins.attrNames opened);
      exposed = builtins.filter (name: !(builtins.elem name members)) (builtins.attrNames opened);
      # Whether another machine can reach `port` through the firewall.
      open =
        port:
        firewall == null
        || !(firewall.enable or true)
        || builtins.elem port (firewall.allowedTCPPorts or [ ])
        || builtins.any (r: r.from <= port && port <= r.to) (firewall.allowedTCPPortRanges or [ ])
        || builtins.any (i: builtins.elem port (i.allowedTCPPorts or [ ])) (
          builtins.attrValues (firewall.interfaces or { })
        );
      closed =
        option: what: listen: port:
        if isLoopback listen || open port then
          [ ]
        else
          [
            "${option}: ${what} listens on ${listen}, but the firewall keeps port ${toString port} closed, so no other machine reaches it (set ${option}.openFirewall = true, or listen on 127.0.0.1)."
          ];
      served = builtins.filter (name: !(builtins.elem name members)) (builtins.attrNames instances);
    in
    map (
      name:
      "services.llamanix: port ${toString instances.${name}.port} is opened in the firewall but the instance listens on ${instances.${name}.listen} only."
    ) (builtins.filter (name: isLoopback instances.${name}.listen) exposed)
    ++ map (
      name:
      "services.llamanix.instances.${name}.openFirewall: ${name} is a member of the router, which gives it an internal port on 127.0.0.1, so nothing is opened for it; open the router's port instead (services.llamanix.router.openFirewall)."
    ) routed
    ++ (
      if router != null && (router.openFirewall or false) && isLoopback router.listen then
        [
          "services.llamanix: port ${toString router.port} is opened in the firewall but the router listens on ${router.listen} only (set services.llamanix.router.listen)."
        ]
      else
        [ ]
    )
    ++ (
      if gateway != null && (gateway.openFirewall or false) && isLoopback gateway.listen then
        [
          "services.llamanix: port ${toString gateway.port} is opened in the firewall but the gateway listens on ${gateway.listen} only (set services.llamanix.gateway.listen)."
        ]
      else
        [ ]
    )
    ++ builtins.concatMap (
      name:
      closed "services.llamanix.instances.${name}" "the instance" instances.${name}.listen
        instances.${name}.port
    ) served
    ++ (
      if router == null then
        [ ]
      else
        closed "services.llamanix.router" "the router" router.listen router.port
    )
    ++ (
      if gateway == null then
        [ ]
      else
        closed "services.llamanix.gateway" "LiteLLM" gateway.listen gateway.port
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
  # Host keys: kind is always "nixos", target is this machine, binaries come from `package`,
  # and build_host and sudo say how `llamanix switch` runs nixos-rebuild for it, from elsewhere.
  # `gpu`, `cuda_archs` and `gpu_sandbox` are services.llamanix.gpu, services.llamanix.cudaArchs
  # and services.llamanix.gpuSandbox.
  hostKeysSetByModule = [
    "kind"
    "target"
    "binaries"
    "build_host"
    "sudo"
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

  # The files a render of one host writes under share/llamanix (modules/render-units.sh),
  # which the module links into /etc/llamanix one by one: /etc/llamanix stays a directory of
  # its own, where a key file may live beside them. instanceNames: the instances' names;
  # router: services.llamanix.router or null.
  renderedFiles =
    {
      instanceNames,
      router,
      metrics ? false,
    }:
    let
      members = if router == null then [ ] else router.members;
    in
    [ "manifest.json" ]
    # The exporter's alert rules and dashboards, each a directory of its own.
    ++ (if metrics then [ "prometheus" "grafana" ] else [ ])
    ++ map (name: "${name}.argv.json") (builtins.filter (name: !(builtins.elem name members)) instanceNames)
    ++ (
      if router == null then
        [ ]
      else
        [
          "router.argv.json"
          (if router.kind == "llama-swap" then "llama-swap.yaml" else "router-presets.ini")
        ]
    );

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
    )
    // (
      # [metrics] is services.llamanix.prometheus, enabled: the TOML asks for the exporter, as
      # `llamanix render` reads it.
      if config ? metrics then { prometheus = config.metrics // { enable = true; }; } else { }
    )
    // (
      # [gateway] on this host is services.llamanix.gateway: its keys less kind and host, and
      # the replicas, which only the whole file knows (every host's instances).
      if (config.gateway.host or null) == host then
        {
          gateway = builtins.removeAttrs config.gateway gatewayKeysSetByModule // {
            replicas = gatewayReplicas path;
          };
        }
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

  # --- The gateway (docs/gateway.md): LiteLLM in front of every host's instances ---------------
  #
  # render/gateway.py is the source of truth; what is repeated here is checked against it by
  # tests/test_nix_equivalence.py (the settings, the replicas' URLs, the addresses, the refused
  # releases).

  # Gateway keys the module sets itself: its kind is the one there is, its host is this machine.
  gatewayKeysSetByModule = [
    "kind"
    "host"
  ];
  # Options of services.llamanix.gateway that are not schema keys.
  moduleOnlyGatewayOptions = [
    "replicas"
    "package"
    "openFirewall"
  ];

  # schema.py's LITELLM_REFUSED: releases that must never run.
  litellmRefused = {
    "1.82.7" = "was a compromised release on PyPI";
    "1.82.8" = "was a compromised release on PyPI";
  };

  # core/address.py, for the addresses the gateway reaches replicas at.
  bareHost =
    host:
    let
      n = builtins.stringLength host;
    in
    if n >= 2 && builtins.substring 0 1 host == "[" && builtins.substring (n - 1) 1 host == "]" then
      builtins.substring 1 (n - 2) host
    else
      host;
  # 0.0.0.0, or an IPv6 address of zeros only ("::", "0::0", ...).
  isWildcard =
    listen:
    let
      host = bareHost listen;
    in
    host == "0.0.0.0" || builtins.match "[0:]*:[0:]*" host != null;
  connectHost =
    listen:
    let
      host = bareHost listen;
      lower = toLower host;
    in
    if isWildcard listen then
      (if hasInfix ":" host then "::1" else "127.0.0.1")
    else if lower == "localhost" || builtins.match "localhost\\.+" lower != null then
      "127.0.0.1"
    else
      host;
  urlHost =
    address:
    let
      host = bareHost address;
    in
    if hasInfix ":" host then "[${host}]" else host;
  # "root@gpu1:2222" -> "gpu1", "ssh://root@gpu1:2222" -> "gpu1", "[fd00::1]:22" -> "fd00::1"
  # (core/address.py's parse_target, which validate runs first).
  targetHost =
    target:
    let
      scheme = "ssh://";
      unschemed =
        if hasPrefix scheme target then
          builtins.substring (builtins.stringLength scheme) (-1) target
        else
          target;
      parts = builtins.split "@" unschemed;
      machine = builtins.elemAt parts (builtins.length parts - 1);
      colons = (builtins.length (builtins.split ":" machine) - 1) / 2;
    in
    if hasPrefix "[" machine then
      bareHost (builtins.head (builtins.split "]" machine) + "]")
    else if colons == 1 then
      builtins.head (builtins.split ":" machine)
    else
      machine;
  # How another machine reaches a server listening on `listen`.
  remoteHost =
    listen: target: hostName:
    if !(isWildcard listen) then
      connectHost listen
    else if target != null && target != "" then
      targetHost target
    else
      hostName;

  # The variable a replica's key reaches LiteLLM through (render/gateway.py's key_env).
  gatewayKeyEnv =
    instance:
    "LLAMANIX_KEY_"
    + builtins.concatStringsSep "" (
      map (ch: if builtins.match "[A-Za-z0-9]" ch != null then toUpper ch else "_") (chars instance)
    );

  # Every instance of every host in llamanix.toml as a replica of the gateway, [defaults] merged:
  # [ { instance; alias; url; apiKeyFile; } ], in instance-name order (Nix reads TOML tables
  # unordered). A router's member is reached through its router.
  gatewayReplicas =
    path:
    let
      config = builtins.fromTOML (builtins.readFile path);
      defaults = config.defaults or { };
      hosts = config.hosts or { };
      gatewayHost = config.gateway.host;
      only = builtins.attrNames hosts;
      replica =
        name: raw:
        let
          inst = defaults // raw;
          hostName = inst.host or (if builtins.length only == 1 then builtins.head only else null);
          hostTable = hosts.${hostName} or { };
          router = hostTable.router or null;
          routed = router != null && builtins.elem name (router.members or [ ]);
          served =
            if routed then
              {
                listen = router.listen or schema.router.listen.default;
                port = router.port or schema.router.port.default;
                keyFile = router.api_key_file or null;
              }
            else
              {
                listen = inst.listen or schema.instances.listen.default;
                port = inst.port or schema.instances.port.default;
                keyFile = inst.api_key_file or null;
              };
          # On the gateway's own host a wildcard listener answers on loopback.
          address =
            if hostName == gatewayHost then
              remoteHost served.listen "127.0.0.1" hostName
            else
              remoteHost served.listen (hostTable.target or null) hostName;
        in
        {
          instance = name;
          alias = inst.alias or name;
          url = "http://${urlHost address}:${toString served.port}/v1";
          apiKeyFile = served.keyFile;
        };
    in
    map (name: replica name config.instances.${name}) (builtins.attrNames (config.instances or { }));

  # render/gateway.py's health_url: a replica's /health (its server's, or its router's, which
  # loads no member).
  gatewayHealthUrl =
    url:
    let
      n = builtins.stringLength url;
      base =
        if n >= 3 && builtins.substring (n - 3) 3 url == "/v1" then builtins.substring 0 (n - 3) url else url;
    in
    base + "/health";

  # render/gateway.py's plugin_settings, for a NixOS gateway: no routes file (a rolling switch
  # tells only a Debian gateway where caches moved).
  gatewayPluginSettings =
    { gateway, replicas }:
    {
      version = 1;
      interval = gateway.health_check_interval;
      routes = null;
      inherit (gateway) conversations;
      affinity = builtins.listToAttrs (
        map (r: {
          name = r.alias;
          value = gateway.affinity && !(builtins.elem r.alias gateway.no_affinity);
        }) replicas
      );
      health = builtins.listToAttrs (
        map (r: {
          name = r.instance;
          value = gatewayHealthUrl r.url;
        }) replicas
      );
    };

  # LiteLLM's config, as render/gateway.py's settings() writes it. gateway: the option values
  # of services.llamanix.gateway (schema keys), replicas: as gatewayReplicas gives them.
  gatewaySettings =
    args@{ gateway, replicas }:
    {
      model_list = map (r: {
        model_name = r.alias;
        litellm_params = {
          model = "openai/${r.alias}";
          api_base = r.url;
          # LiteLLM's OpenAI client needs a string even where the server takes none.
          api_key = if r.apiKeyFile != null then "os.environ/${gatewayKeyEnv r.instance}" else "none";
        };
        # The deployment's id: llamanix's plugin names replicas by instance.
        model_info.id = r.instance;
      }) replicas;
      router_settings = {
        inherit (gateway) routing_strategy;
        num_retries = gateway.retries;
        # Retry on another replica at once: a replica that is down stays down for seconds.
        retry_after = 0;
        # A replica restarting behind its fence must not be cooled down (docs/gateway.md).
        disable_cooldowns = true;
      };
      general_settings = {
        master_key = "os.environ/LITELLM_MASTER_KEY";
        # LiteLLM's own checks send each replica a completion: llamanix's plugin checks /health.
        background_health_checks = false;
      };
      litellm_settings = {
        request_timeout = 600;
        callbacks = [ "${gatewayPluginModule}.handler" ];
      };
      # The plugin's settings, as one line of JSON (render/gateway.py's plugin_settings_text).
      environment_variables.LLAMANIX_GATEWAY = builtins.toJSON (gatewayPluginSettings args);
    };

  # The module LiteLLM loads (tools/llamanix/render/litellm_plugin/, whose directory the NixOS
  # module puts on LiteLLM's PYTHONPATH).
  gatewayPluginModule = "llamanix_gateway";

  # The keys' way into LiteLLM on NixOS. nixpkgs' services.litellm (its
  # nixos/modules/services/misc/litellm.nix) runs its own ExecStart and takes secrets through
  # `environmentFile`; the keys live in files of their own (`api_key_file`, as on Debian, and
  # as agenix and sops-nix write them). So a oneshot unit loads the key files as credentials
  # and writes that environment file into its runtime directory (tmpfs, mode 0600, root's),
  # before LiteLLM starts; restarting LiteLLM restarts it (PartOf) and reads the files again.
  gatewayKeysUnit = "llamanix-gateway-keys";
  gatewayEnvironmentFile = "/run/${gatewayKeysUnit}/litellm.env";

  # [ { variable; credential; file; } ]: the master key, then each replica's key once.
  gatewayKeys =
    { gateway, replicas }:
    let
      keyed = builtins.filter (r: r.apiKeyFile != null) replicas;
      once = builtins.foldl' (
        acc: r: if builtins.elem r.instance (map (x: x.instance) acc) then acc else acc ++ [ r ]
      ) [ ] keyed;
    in
    [
      {
        variable = "LITELLM_MASTER_KEY";
        credential = "master-key";
        file = gateway.api_key_file;
      }
    ]
    ++ map (r: {
      variable = gatewayKeyEnv r.instance;
      credential = "key-${r.instance}";
      file = r.apiKeyFile;
    }) once;

  # The keys unit's LoadCredential= lines: each key file under the name its script reads.
  gatewayCredentials = args: map (k: "${k.credential}:${k.file}") (gatewayKeys args);

  # What the keys unit runs: one `NAME='key'` line per key (systemd reads a single-quoted value
  # as it is), written whole or not at all. A key that is empty, or holds a quote or a line
  # break (which that line cannot carry), or is no bearer token (as core/api_key.py refuses on
  # Debian), fails the unit, and with it LiteLLM's start, naming the file. No key is in this text; the files' paths are (as in LoadCredential=).
  # shellArg: lib.escapeShellArg.
  gatewayKeysScript =
    args@{ shellArg, ... }:
    let
      keys = gatewayKeys (builtins.removeAttrs args [ "shellArg" ]);
    in
    builtins.concatStringsSep "\n" (
      [
        "set -eu"
        "umask 077"
        "nl='"
        "'"
        "entry() {"
        ("  " + ''key=$(cat "$CREDENTIALS_DIRECTORY/$2")'')
        ("  " + ''case "$key" in'')
        ("    " + ''"") echo "${gatewayKeysUnit}: $3 is empty (write the key into it)" >&2; exit 1 ;;'')
        ("    " + ''*"'"* | *"$nl"*) echo "${gatewayKeysUnit}: the key in $3 holds a quote or a line break, which LiteLLM's environment file cannot carry (use a key of letters, digits, - and _)" >&2; exit 1 ;;'')
        ("    " + ''*[!A-Za-z0-9._~+/=-]*) echo "${gatewayKeysUnit}: the key in $3 is not a bearer token (letters, digits and -._~+/, then = padding): no other text is sent, as it may be another file's secret" >&2; exit 1 ;;'')
        "  esac"
        ("  " + ''printf "%s='%s'\n" "$1" "$key"'')
        "}"
        "{"
      ]
      ++ map (k: "  entry ${k.variable} ${k.credential} ${shellArg k.file}") keys
      ++ [
        ''} > "$RUNTIME_DIRECTORY/litellm.env.tmp"''
        ''mv "$RUNTIME_DIRECTORY/litellm.env.tmp" "$RUNTIME_DIRECTORY/litellm.env"''
      ]
    )
    + "\n";

  # LiteLLM's liveliness endpoint as the gateway's own host reaches it.
  gatewayLivelinessUrl =
    gateway: "http://${urlHost (connectHost gateway.listen)}:${toString gateway.port}/health/liveliness";

  # ExecStartPost=: started means serving, as on Debian (render/gateway.py's ready_script): wait
  # until the liveliness endpoint answers, and fail as soon as LiteLLM has exited. So
  # `nixos-rebuild switch` fails for a gateway that does not serve. curl: its program.
  gatewayReadyScript =
    { gateway, curl }:
    ''
      until ${curl} --silent --fail --max-time 2 --output /dev/null ${gatewayLivelinessUrl gateway}; do
        kill -0 "$MAINPID" 2>/dev/null || exit 1
        sleep 0.5
      done
    '';

  # The module's one line for a LiteLLM package that must not run, or null.
  litellmRefusal =
    version:
    if litellmRefused ? ${version} then
      "services.llamanix.gateway.package: LiteLLM ${version} ${litellmRefused.${version}} and is refused (use a litellm package of another release)"
    else
      null;
}
