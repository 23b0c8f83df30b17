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
# driver (hardware.nvidia.enabled), and cudaCapabilities (JSON) one whose nixpkgs config names
# CUDA capabilities: both change the default of services.llamanix.cudaArchs.
# llamaSwap = "false" evaluates against a pkgs without llama-swap.
#
# With libPath, `-A checks` gives the module's failed assertions and warnings without failing,
# and `-A routerPackage` what services.llamanix.router.package declares.
#
# `-A gateway` (a host that runs the [gateway]): what services.litellm gets and the units that
# run it; from the module with libPath, from the same nix/lib.nix functions the module calls
# without. litellmVersion: the version of the fake pkgs.litellm.
#
# With libPath, litellmModule is nixpkgs' own nixos/modules/services/misc/litellm.nix (a file
# fetched from NixOS/nixpkgs, never committed: scripts/nix-real-lib), which is loaded beside the
# module, so the merged litellm unit is the one a NixOS host would get; "none" evaluates a NixOS
# that has no such module. `-A etc` and `-A firewall` give the files linked under /etc and the
# opened ports, `-A prometheus` what services.prometheus gets and the exporter's drop-in.
{
  toml,
  host,
  libPath ? "",
  litellmModule ? "",
  nvidia ? "false",
  # JSON: nixpkgs' config.cudaCapabilities of the system's pkgs (null: not set).
  cudaCapabilities ? "null",
  llamaSwap ? "true",
  litellmVersion ? "1.80.0",
  # JSON of one more definition of services.llamanix, merged as the module system merges a
  # second module's (what a host writes beside fromToml: `openFirewall`, say).
  extra ? "{}",
  # JSON of one more module of the system, beside services.llamanix (with libPath only): what
  # else the host sets, `services.prometheus.enable` or `services.litellm.environmentFile`, say.
  module ? "{}",
}:
let
  llamanixLib = import ../../nix/lib.nix;
  settings = llamanixLib.fromToml (/. + toml) host;

  # What mkVariant would build, the package set, pkgs.litellm: tests/nix/fake-pkgs.nix (whose
  # lib is only read by the real evaluation: the stub needs none of it here).
  fakes = import ./fake-pkgs.nix {
    lib = if libPath == "" then import ./stub-lib.nix else import libPath;
    llamaSwap = llamaSwap == "true";
    inherit litellmVersion;
    cudaCapabilities = builtins.fromJSON cudaCapabilities;
  };
  inherit (fakes) fakePackage;

  stubEval =
    let
      lib = import ./stub-lib.nix;
      schemaOptions = import ../../nix/schema-options.nix { inherit lib; };
      withDefaults =
        options: values: builtins.mapAttrs (name: option: values.${name} or (option.default or null)) options;
      # The module's own defaults: variant and gpuSandbox from the schema, cudaArchs from the
      # host.
      hostArchs =
        settings.cudaArchs or (llamanixLib.defaultCudaArchs {
          cudaCapabilities = builtins.fromJSON cudaCapabilities;
          nvidiaEnabled = nvidia == "true";
        });
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
          in
          {
            settings = llamanixLib.gatewaySettings args;
            inherit (settings.gateway) replicas;
            loadCredential = llamanixLib.gatewayCredentials args;
            keysScript = llamanixLib.gatewayKeysScript (args // { shellArg = lib.escapeShellArg; });
            readyScript = llamanixLib.gatewayReadyScript {
              inherit gateway;
              curl = "/nix/store/00000000000000000000000000000000-curl/bin/curl";
            };
            failed =
              let
                refusal = llamanixLib.litellmRefusal litellmVersion;
              in
              if refusal == null then [ ] else [ refusal ];
          };
      etc =
        if settings.instances == { } then
          [ ]
        else
          map (file: "llamanix/${file}") (
            llamanixLib.renderedFiles {
              instanceNames = builtins.attrNames settings.instances;
              router =
                if settings ? router then withDefaults schemaOptions.routerOptions settings.router else null;
              metrics = settings.prometheus.enable or false;
            }
          );
    };

  realEval =
    let
      lib = import libPath;
      nixosStub = import ./nixos-stub.nix { inherit lib; };
      inherit (fakes) pkgs;
      litellmModules =
        if litellmModule == "none" then
          [ ]
        else if litellmModule == "" then
          throw "module-eval.nix: with libPath, give litellmModule: nixpkgs' nixos/modules/services/misc/litellm.nix (scripts/nix-real-lib says where to get it), or \"none\""
        else
          [ (/. + litellmModule) ];
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
          { services.llamanix = builtins.fromJSON extra; }
          (builtins.fromJSON module)
        ]
        ++ litellmModules;
      };
      # nixpkgs' litellm module alone, given what the module handed it: what its unit is without
      # services.llamanix, so a test can see that the module keeps all of it.
      litellmAlone =
        let
          handed = evaluated.config.services.litellm;
          alone = lib.evalModules {
            modules = [
              nixosStub
              { _module.args.pkgs = pkgs; }
              {
                services.litellm = {
                  inherit (handed)
                    enable
                    package
                    host
                    port
                    settings
                    environmentFile
                    openFirewall
                    ;
                };
              }
            ]
            ++ litellmModules;
          };
        in
        describeUnit alone.config.systemd.services.litellm;
      cfg = evaluated.config.services.llamanix;
      failed = map (a: a.message) (builtins.filter (a: !a.assertion) evaluated.config.assertions);
      services = evaluated.config.systemd.services;
      # A unit as data: store paths for scripts, each script's text beside it.
      describeUnit =
        unit:
        let
          textOf = value: value.text or null;
          pathOf = value: value.outPath or value;
          serviceConfig = builtins.mapAttrs (
            _: value: if builtins.isList value then map pathOf value else pathOf value
          ) unit.serviceConfig;
          scripts = builtins.mapAttrs (_: value: if builtins.isList value then map textOf value else textOf value) (
            builtins.intersectAttrs {
              ExecStart = null;
              ExecStartPre = null;
              ExecStartPost = null;
            } unit.serviceConfig
          );
        in
        {
          inherit (unit)
            after
            wants
            requires
            before
            partOf
            wantedBy
            environment
            startLimitIntervalSec
            startLimitBurst
            ;
          inherit serviceConfig scripts;
        };
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
        else if failed != [ ] then
          { inherit failed; }
        else
          let
            litellm = evaluated.config.services.litellm;
          in
          {
            inherit failed;
            inherit (litellm) settings;
            inherit (cfg.gateway) replicas;
            # What the module hands nixpkgs' services.litellm besides the settings.
            service = {
              inherit (litellm)
                enable
                host
                port
                openFirewall
                environmentFile
                ;
              package = litellm.package.outPath;
            };
            # The units as NixOS merges them: nixpkgs' litellm unit with the module's additions,
            # and the unit that writes the keys into its environment file.
            litellmUnit = describeUnit services.litellm;
            keysUnit = describeUnit services.${(import ../../nix/lib.nix).gatewayKeysUnit};
            inherit litellmAlone;
            inherit (evaluated.config) warnings;
          };
      # The Prometheus parts and the exporter's drop-in, as NixOS would merge them (null: not set).
      prometheus = {
        inherit (evaluated.config.services) prometheus;
        exporter = services.llamanix-exporter or null;
      };
      # The files linked under /etc.
      etc = builtins.attrNames evaluated.config.environment.etc;
      firewall = evaluated.config.networking.firewall.allowedTCPPorts;
      # What decides whether a target waits for a unit: who wants or requires it, its ordering
      # and its default dependencies (systemd.target(5)), for every service and target.
      boot =
        let
          edges = unit: {
            inherit (unit)
              wantedBy
              requiredBy
              after
              before
              ;
            defaultDependencies = unit.unitConfig.DefaultDependencies or true;
          };
        in
        {
          services = builtins.mapAttrs (_: edges) services;
          targets = builtins.mapAttrs (_: edges) evaluated.config.systemd.targets;
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
