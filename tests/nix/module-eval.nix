# services.llamanix = llamanix.lib.fromToml TOML HOST, evaluated the way a NixOS host would, for
# tests/test_nix_equivalence.py:
#
#   nix-instantiate --eval --strict --json tests/nix/module-eval.nix \
#     --argstr toml PATH --argstr host HOST [--argstr libPath DIR] [--argstr nvidia true]
#
# Returns { config = the JSON the module hands `llamanix render`; cudaArchs = NAME -> the CUDA
# architectures of the package instance NAME runs; options = the option names it declares }.
#
# Without libPath (CI: no nixpkgs) the stub lib stands in, and option defaults are applied the
# way the module system applies them (tests/nix/module-json.nix). With libPath (a real nixpkgs
# lib/ directory) the real modules/llamanix.nix is evaluated by lib.evalModules, with the few
# NixOS options it reads or sets declared loosely and a package set whose derivations are plain
# attribute sets, so nothing is built. nvidia = "true" evaluates a host that enables the NVIDIA
# driver (hardware.nvidia.enabled), which changes the default of services.llamanix.cudaArchs.
# llamaSwap = "false" evaluates against a pkgs without llama-swap.
#
# With libPath, `-A checks` gives the module's failed assertions and warnings without failing,
# and `-A routerPackage` what services.llamanix.router.package declares.
#
# `-A gateway` (a host that runs the [gateway]): what services.litellm gets, { settings;
# replicas; loadCredential; execStart; startScript; }; from the module with libPath, from the
# same nix/lib.nix functions the module calls without. litellmVersion: the version of the fake
# pkgs.litellm.
{
  toml,
  host,
  libPath ? "",
  nvidia ? "false",
  llamaSwap ? "true",
  litellmVersion ? (import ../../nix/lib.nix).schema.gateway.version.default,
}:
let
  llamanixLib = import ../../nix/lib.nix;
  settings = llamanixLib.fromToml (/. + toml) host;

  # What mkVariant would build: a store-like path naming the variant and its architectures.
  fakePackage =
    { variant, cudaArchs }:
    {
      outPath = "/nix/store/00000000000000000000000000000000-llama-cpp-${variant}-${builtins.concatStringsSep "_" cudaArchs}";
      passthru.cudaSupport = cudaArchs != [ ];
      inherit variant cudaArchs;
    };
  packageSet = {
    llamanix = {
      outPath = "/nix/store/00000000000000000000000000000000-llamanix";
    };
    mkVariant = fakePackage;
    mkCapabilities = _: "/nix/store/00000000000000000000000000000000-capabilities.json";
  };

  fakeLitellm = {
    type = "derivation";
    name = "litellm-${litellmVersion}";
    version = litellmVersion;
    outPath = "/nix/store/00000000000000000000000000000000-litellm";
    meta.mainProgram = "litellm";
  };

  stubEval =
    let
      lib = import ./stub-lib.nix;
      schemaOptions = import ../../nix/schema-options.nix { inherit lib; };
      withDefaults =
        options: values: builtins.mapAttrs (name: option: values.${name} or (option.default or null)) options;
      # The module's own defaults: variant and gpuSandbox from the schema, cudaArchs from the
      # host.
      hostArchs = settings.cudaArchs or (if nvidia == "true" then llamanixLib.archSets."" else [ ]);
      instance =
        values:
        withDefaults schemaOptions.instanceOptions values
        // {
          speculative = withDefaults schemaOptions.speculativeOptions (values.speculative or { });
        };
      packages = builtins.mapAttrs (
        _: values:
        fakePackage {
          variant = (instance values).variant;
          cudaArchs = values.cudaArchs or hostArchs;
        }
      ) settings.instances;
    in
    {
      config = llamanixLib.configData {
        inherit host;
        router =
          if settings ? router then
            {
              router = withDefaults schemaOptions.routerOptions settings.router;
              binary =
                if settings.router.kind == "llama-swap" then
                  "/nix/store/00000000000000000000000000000000-llama-swap/bin/llama-swap"
                else
                  null;
            }
          else
            null;
        gpu = settings.gpu or null;
        cudaArchs = hostArchs;
        gpuSandbox = settings.gpuSandbox or llamanixLib.schema.hosts.gpu_sandbox.default;
        instances = builtins.mapAttrs (name: values: {
          binary = "${packages.${name}}/bin/llama-server";
          instance = instance values;
        }) settings.instances;
      }
      # As modules/llamanix.nix: the exporter and rules are rendered when prometheus is enabled.
      // (
        if (settings.prometheus.enable or false) then
          {
            metrics = llamanixLib.schemaValues llamanixLib.schema.metrics (
              withDefaults schemaOptions.metricsOptions settings.prometheus
            );
          }
        else
          { }
      );
      cudaArchs = builtins.mapAttrs (_: p: p.cudaArchs) packages;
      gateway =
        if !(settings ? gateway) then
          null
        else
          let
            gateway = withDefaults schemaOptions.gatewayOptions settings.gateway;
            args = {
              inherit gateway;
              inherit (settings.gateway) replicas;
            };
            configFile = "/nix/store/00000000000000000000000000000000-config.yaml";
            startScript = llamanixLib.gatewayStartScript (
              args
              // {
                program = "${fakeLitellm}/bin/litellm";
                inherit configFile;
                shellArg = lib.escapeShellArg;
              }
            );
          in
          {
            settings = llamanixLib.gatewaySettings args;
            inherit (settings.gateway) replicas;
            loadCredential = llamanixLib.gatewayCredentials args;
            execStart = "/nix/store/00000000000000000000000000000000-llamanix-gateway-start";
            inherit startScript;
            refusal = llamanixLib.litellmRefusal litellmVersion;
          };
    };

  realEval =
    let
      lib = import libPath;
      nixosStub = import ./nixos-stub.nix { inherit lib; };
      pkgs = {
        writeText = name: text: {
          inherit name text;
          outPath = "/nix/store/00000000000000000000000000000000-${name}";
        };
        runCommand = name: attrs: script: attrs // { inherit name script; };
        runtimeShell = "/bin/sh";
        writeShellScript = name: text: {
          inherit name text;
          outPath = "/nix/store/00000000000000000000000000000000-${name}";
        };
        formats.yaml = _: {
          generate = name: value: {
            inherit name value;
            outPath = "/nix/store/00000000000000000000000000000000-${name}";
          };
        };
        litellm = fakeLitellm;
        stdenv.hostPlatform.system = "x86_64-linux";
        llamanixPackages = packageSet;
      }
      // (
        if llamaSwap == "true" then
          {
            llama-swap = {
              type = "derivation";
              name = "llama-swap";
              outPath = "/nix/store/00000000000000000000000000000000-llama-swap";
              meta.mainProgram = "llama-swap";
            };
          }
        else
          { }
      );
      evaluated = lib.evalModules {
        modules = [
          ../../modules/llamanix.nix
          nixosStub
          {
            _module.args.pkgs = pkgs;
            networking.hostName = host;
            hardware = if nvidia == "true" then { nvidia.enabled = true; } else { };
            services.llamanix = settings // {
              enable = true;
            };
          }
        ];
      };
      cfg = evaluated.config.services.llamanix;
      failed = map (a: a.message) (builtins.filter (a: !a.assertion) evaluated.config.assertions);
    in
    {
      config =
        if failed != [ ] then
          throw (builtins.concatStringsSep "\n" failed)
        else
          builtins.fromJSON evaluated.config.system.build.llamanixUnits.passthru.configFile.text;
      checks = {
        inherit failed;
        inherit (evaluated.config) warnings;
      };
      routerPackage =
        let
          option = (evaluated.options.services.llamanix.router.type.getSubOptions [ ]).package;
        in
        {
          type = option.type.name;
          defaultText = option.defaultText.text;
          inherit (option) description;
        };
      cudaArchs = builtins.mapAttrs (_: inst: inst.package.cudaArchs) cfg.instances;
      gateway =
        if cfg.gateway == null then
          null
        else
          let
            litellm = evaluated.config.services.litellm;
            unit = evaluated.config.systemd.services.litellm;
            service = unit.serviceConfig;
          in
          {
            inherit (litellm) settings;
            inherit (cfg.gateway) replicas;
            loadCredential = service.LoadCredential;
            # The script's store path, and the script.
            execStart = service.ExecStart.outPath or service.ExecStart;
            startScript = service.ExecStart.text or null;
            refusal =
              let
                failed = map (a: a.message) (
                  builtins.filter (a: !a.assertion) evaluated.config.assertions
                );
              in
              if failed == [ ] then null else builtins.head failed;
            # What the module hands nixpkgs' services.litellm besides the settings, and what it
            # adds to the unit's environment.
            service = {
              inherit (litellm) enable host port;
              package = litellm.package.outPath;
              environment = litellm.environment or null;
            };
            unitEnvironment = unit.environment;
            inherit (evaluated.config) warnings;
          };
      # The units NixOS enables (a router's members have none) and the ports it opens.
      units = builtins.attrNames evaluated.config.systemd.services;
      ports = evaluated.config.networking.firewall.allowedTCPPorts or [ ];
      options = {
        top = builtins.attrNames evaluated.options.services.llamanix;
        instance = builtins.attrNames (
          builtins.removeAttrs (evaluated.options.services.llamanix.instances.type.getSubOptions [ ]) [
            "_module"
          ]
        );
        router = builtins.attrNames (
          builtins.removeAttrs (evaluated.options.services.llamanix.router.type.getSubOptions [ ]) [
            "_module"
          ]
        );
        speculative = builtins.attrNames (
          builtins.removeAttrs
            ((evaluated.options.services.llamanix.instances.type.getSubOptions [ ]).speculative.type.getSubOptions
              [ ]
            )
            [ "_module" ]
        );
      };
    };
in
if libPath == "" then stubEval else realEval
