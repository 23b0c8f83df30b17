# services.llamanix: llama-server instances, each built from one of the llamanix flake's llama.cpp
# variants, rendered by the llamanix generator into hardened systemd units.
#
# The instance options are llamanix.toml's keys (made from tools/llamanix/data/schema.json by
# nix/schema-options.nix). At build time the module writes the instances as JSON in
# llamanix.toml's shape and runs `llamanix render` on it (modules/render-units.sh), checked
# against a probe of each instance's own llama-server. A config mistake therefore fails
# `nixos-rebuild build` with the generator's one-line message, before anything is switched.
# Nothing is read back into the evaluation: no import-from-derivation.
{
  config,
  lib,
  options,
  pkgs,
  ...
}:
let
  inherit (lib)
    literalExpression
    literalMD
    mkEnableOption
    mkIf
    mkOption
    types
    ;

  cfg = config.services.llamanix;
  llamanixLib = import ../nix/lib.nix;
  schemaOptions = import ../nix/schema-options.nix { inherit lib; };
  hostSchema = llamanixLib.schema.hosts;

  # The host name the generator sees; the units do not depend on it beyond the manifest.
  hostName = if config.networking.hostName != "" then config.networking.hostName else "localhost";

  # hardware.nvidia.enabled is read-only and follows services.xserver.videoDrivers; a module
  # set without the NVIDIA module (a container, a test) has neither.
  nvidiaEnabled =
    config.hardware.nvidia.enabled
      or (builtins.elem "nvidia" (config.services.xserver.videoDrivers or [ ]));
  # nixpkgs' own CUDA capabilities, as this system's pkgs were made with them (nixpkgs.config,
  # or the config of a given nixpkgs.pkgs); null where nothing says.
  nixpkgsCudaCapabilities =
    pkgs.config.cudaCapabilities or config.nixpkgs.config.cudaCapabilities or null;
  cudaArchType = types.strMatching "[0-9]+\\.[0-9]+[af]?";

  instanceModule =
    { name, config, ... }:
    {
      options = schemaOptions.instanceOptions // {
        speculative = mkOption {
          type = types.submodule { options = schemaOptions.speculativeOptions; };
          default = { };
          description = "Speculative decoding (the `[instances.NAME.speculative]` table of llamanix.toml).";
        };

        package = mkOption {
          type = types.package;
          default = cfg.packageSet.mkVariant {
            inherit (config) variant cudaArchs;
          };
          defaultText = literalMD "the llamanix flake's `llama-cpp-<variant>`, built for `cudaArchs`";
          description = ''
            The llama.cpp build that serves instance `${name}`; its `bin/llama-server` is run.
            By default it is this flake's `llama-cpp-<variant>` package built for `cudaArchs`,
            so changing `variant` flips the backend. Set it to use any other build; the
            generator then probes that binary at build time and checks every flag against it.
          '';
        };

        cudaArchs = mkOption {
          type = types.listOf cudaArchType;
          default = cfg.cudaArchs;
          defaultText = literalExpression "config.services.llamanix.cudaArchs";
          example = [ "12.0" ];
          description = ''
            CUDA compute capabilities the default `package` is compiled for; `[ ]` builds for
            the CPU only. Only this package is rebuilt: nixpkgs' global `cudaCapabilities`
            stays untouched, so everything else keeps hitting the binary caches.
          '';
        };

        openFirewall = mkOption {
          type = types.bool;
          default = false;
          description = ''
            Open `port` in the firewall. Only useful with a `listen` address other than
            127.0.0.1.
          '';
        };
      };
    };

  # NAME -> the probe JSON of that instance's llama-server, made at build time.
  capabilitiesOf =
    inst: inst.package.passthru.capabilities or (cfg.packageSet.mkCapabilities inst.package);

  routerData =
    if cfg.router == null then
      null
    else
      {
        router = cfg.router;
        # llama-server's router runs its members' own binary; llama-swap is a program of its own.
        binary = if cfg.router.kind == "llama-swap" then lib.getExe cfg.router.package else null;
      };
  routed = if cfg.router == null then [ ] else cfg.router.members;

  configFile = pkgs.writeText "llamanix.json" (
    builtins.toJSON (
      llamanixLib.configData {
        host = hostName;
        inherit (cfg) gpu cudaArchs gpuSandbox;
        router = routerData;
        instances = lib.mapAttrs (_: inst: {
          binary = "${inst.package}/bin/llama-server";
          instance = inst;
        }) cfg.instances;
      }
      # The exporter's unit and rules are rendered with the instances (modules/prometheus.nix).
      // lib.optionalAttrs cfg.prometheus.enable {
        metrics = llamanixLib.schemaValues llamanixLib.schema.metrics cfg.prometheus;
      }
    )
  );

  # The exact command of this derivation is modules/render-units.sh; tests/test_nix.py runs the
  # same script on the same JSON shape.
  units =
    pkgs.runCommand "llamanix-units-${hostName}"
      {
        nativeBuildInputs = [ cfg.packageSet.llamanix ];
        passthru = { inherit configFile; };
      }
      ''
        ${pkgs.runtimeShell} ${./render-units.sh} ${configFile} ${lib.escapeShellArg hostName} "$out" ${
          lib.escapeShellArgs (lib.mapAttrsToList (name: inst: "${name}=${capabilitiesOf inst}") cfg.instances)
        }
      '';

  anyCuda = lib.any (inst: inst.package.passthru.cudaSupport or false) (
    lib.attrValues cfg.instances
  );
  # A router's member listens on loopback inside the router: only the router's port is opened.
  exposed = lib.attrValues (
    lib.filterAttrs (name: inst: inst.openFirewall && !(builtins.elem name routed)) cfg.instances
  );

  # The gateway (docs/gateway.md): nixpkgs' services.litellm
  # (nixos/modules/services/misc/litellm.nix) with render/gateway.py's settings. Its ExecStart
  # stays nixpkgs'; the keys reach LiteLLM through an EnvironmentFile= of the unit, which a
  # oneshot unit writes from the key files (nix/lib.nix gatewayKeysScript).
  gw = cfg.gateway;
  gatewayArgs = {
    gateway = gw;
    inherit (gw) replicas;
  };
  keysUnit = llamanixLib.gatewayKeysUnit;
  # A NixOS without nixpkgs' LiteLLM module (before 25.05) must still evaluate without a
  # gateway: a definition of an option that does not exist fails even under a false mkIf.
  hasLitellm = options ? services && options.services ? litellm;
  # What services.litellm runs and opens: gateway.package and gateway.openFirewall are aliases
  # of its options, so these are read from there (its defaults where neither is set).
  litellm = config.services.litellm;
  gatewayVersion = litellm.package.version or (lib.getVersion litellm.package);
  gatewayRefusal = if hasLitellm then llamanixLib.litellmRefusal gatewayVersion else null;

  replicaModule = {
    options = {
      instance = mkOption {
        type = types.str;
        description = "The instance's name; its key reaches LiteLLM as `LLAMANIX_KEY_<INSTANCE>`.";
      };
      alias = mkOption {
        type = types.str;
        description = "The model group the replica serves: the instance's alias, else its name.";
      };
      url = mkOption {
        type = types.str;
        example = "http://box1.lan:8080/v1";
        description = "Where the gateway reaches the replica (LiteLLM's `api_base`).";
      };
      apiKeyFile = mkOption {
        type = types.nullOr (types.strMatching "/.*");
        default = null;
        description = ''
          The file holding the replica's key (its `api_key_file`, or its router's), on this
          machine. Loaded as a systemd credential: the key never enters the store.
        '';
      };
    };
  };
in
{
  imports = [ ./prometheus.nix ];

  options.services.llamanix = {
    enable = mkEnableOption "llama-server instances managed by llamanix";

    instances = mkOption {
      type = types.attrsOf (types.submodule instanceModule);
      default = { };
      example = literalExpression ''
        {
          qwen = {
            variant = "upstream";
            model = "/srv/models/Qwen3.6-27B-Q4_K_M.gguf";
            alias = "qwen";
            port = 8080;
            context = 131072;
            gpu_layers = "all";
            flash_attn = "on";
            cache_type_k = "q8_0";
            cache_type_v = "q8_0";
          };
        }
      '';
      description = ''
        llama-server instances, one systemd unit `llamanix-<name>.service` each. The options
        are the keys of an `[instances.<name>]` table of llamanix.toml, with the same names
        and meanings; an option left at null is not passed, so llama-server's own default
        applies.

        A unit is started once its server serves (`/health` and a one-token completion), within
        its `TimeoutStartSec=`: 120 s plus 20 s per GiB of model (plus 30 s), up to about 24
        minutes where the model's size is not known at build time. Boot does not wait for that:
        the units are wanted by `llamanix.target`, which `multi-user.target` wants without
        waiting for it, so the machine comes up and each server becomes active when it serves.
        `nixos-rebuild switch` does wait: it restarts each changed unit and waits for its start,
        so it fails, after at most that timeout, when a new backend does not serve (and
        `llamanix switch` gates on top of that).
      '';
    };

    router = mkOption {
      type = types.nullOr (
        types.submodule {
          options = schemaOptions.routerOptions // {
            # Read only by a `kind = "llama-swap"` router, so a nixpkgs without llama-swap still
            # evaluates a llama-server router.
            package = lib.mkPackageOption pkgs "llama-swap" {
              extraDescription = "A `kind = \"llama-swap\"` router runs its `bin/llama-swap`; a `kind = \"llama-server\"` router does not read it.";
            };
            openFirewall = mkOption {
              type = types.bool;
              default = false;
              description = "Open the router's `port` in the firewall.";
            };
          };
        }
      );
      default = null;
      example = literalExpression ''
        {
          kind = "llama-server";
          members = [ "qwen" "small" ];
          port = 8080;
          idle_ttl = 900;
        }
      '';
      description = ''
        One endpoint in front of some of the instances (docs/routers.md): llama-server's router
        mode or llama-swap, run as one unit `llamanix-router.service` whose children are the
        members. The options are the keys of llamanix.toml's `[hosts.NAME.router]` table; the
        members' own `listen` and `port` become internal.
      '';
    };

    gpu = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = hostSchema.gpu.example;
      description = ''
        ${hostSchema.gpu.doc} Used for the VRAM fit and decode-ceiling figures of
        `llamanix plan`; the key `gpu` of llamanix.toml's `[hosts.NAME]` table.
      '';
    };

    cudaArchs = mkOption {
      type = types.listOf cudaArchType;
      # A CUDA build takes hours: only a host that asks for one (nixpkgs' cudaCapabilities, or
      # the NVIDIA driver) gets one by default.
      default = llamanixLib.defaultCudaArchs {
        cudaCapabilities = nixpkgsCudaCapabilities;
        inherit nvidiaEnabled;
      };
      defaultText = literalMD ''
        nixpkgs' `config.cudaCapabilities` when the system sets it (`nixpkgs.config`); else
        `[ "8.6" "12.0" ]` (RTX 3090 and RTX 5090) when the host enables the NVIDIA driver
        (`hardware.nvidia.enabled`, which `services.xserver.videoDrivers = [ "nvidia" ]` sets);
        else `[ ]` (the CPU)
      '';
      example = [ "12.0" ];
      description = ''
        ${hostSchema.cuda_archs.doc} The default of every instance's `cudaArchs`; `[ ]` builds
        for the CPU. The key `cuda_archs` of llamanix.toml's `[hosts.NAME]` table (a TOML host
        that names archs sets this option through `fromToml`).

        Name your GPU's compute capability here (or in nixpkgs' `cudaCapabilities`, which the
        default follows): a build without it gets "no kernel image" at the first start (an
        A100 is 8.0, a T4 7.5, a V100 7.0, an RTX 20xx 7.5), or JIT-compiles the PTX of
        every kernel at start (an H100 is 9.0). `llamanix plan` and `llamanix doctor` name
        such a mismatch between a host's `gpu` and `cuda_archs` in llamanix.toml.
      '';
    };

    gpuSandbox = mkOption {
      type = types.enum hostSchema.gpu_sandbox.values;
      inherit (hostSchema.gpu_sandbox) default;
      description = ''
        ${hostSchema.gpu_sandbox.doc} The key `gpu_sandbox` of llamanix.toml's `[hosts.NAME]`
        table.
      '';
    };

    useSystemNixpkgs = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Build the llama.cpp variants and llamanix with this system's own nixpkgs (its overlays
        and `nixpkgs.config`) instead of the llamanix flake's pinned one. The flake's module
        then adds its `overlays.default` to `nixpkgs.overlays`. The pinned set is what llamanix
        is tested and cached with; the system's set shares one nixpkgs with everything else,
        at the price of builds nobody has tried at that revision.
      '';
    };

    gateway = mkOption {
      type = types.nullOr (
        types.submodule {
          options = schemaOptions.gatewayOptions // {
            version = mkOption {
              type = types.nullOr types.str;
              default = null;
              example = "1.106.12";
              description = ''
                The LiteLLM release llamanix.toml names (its keys were checked against it by
                `llamanix validate`). NixOS runs `package`, whatever its release; when this is
                set and differs from it, a warning says so. `null`: no release is named.
              '';
            };
            replicas = mkOption {
              type = types.listOf (types.submodule replicaModule);
              default = [ ];
              description = ''
                Every instance of every host, as LiteLLM reaches it: one model group per alias.
                A NixOS machine sees only its own instances, so `llamanix.lib.fromToml` computes
                these from the whole llamanix.toml.
              '';
            };
            # Aliases of nixpkgs' own options, which stay the one place these are decided: set,
            # each defines its services.litellm option; unset, nixpkgs' default applies.
            package = mkOption {
              type = types.nullOr types.package;
              default = null;
              defaultText = literalMD "unset: `services.litellm.package` decides (nixpkgs' default `pkgs.litellm`)";
              description = ''
                An alias of `services.litellm.package`, the LiteLLM NixOS runs (whatever its
                release: not the `version` a Debian host installs). Set either one; setting
                both is a conflict, as for any NixOS option.
              '';
            };
            openFirewall = mkOption {
              type = types.nullOr types.bool;
              default = null;
              defaultText = literalMD "unset: `services.litellm.openFirewall` decides (default `false`)";
              description = ''
                An alias of `services.litellm.openFirewall`: open the gateway's `port` in the
                firewall.
              '';
            };
          };
        }
      );
      default = null;
      example = literalExpression ''
        (llamanix.lib.fromToml ./llamanix.toml "box3").gateway
      '';
      description = ''
        LiteLLM's proxy in front of the instances of every host (docs/gateway.md), run by
        nixpkgs' `services.litellm`. The options are the keys of llamanix.toml's `[gateway]`
        table, less `kind` and `host`.
      '';
    };

    packageSet = mkOption {
      type = types.raw;
      internal = true;
      default =
        pkgs.llamanixPackages
          or (throw "services.llamanix: import the module as the llamanix flake's nixosModules.default, or add its overlays.default to nixpkgs.overlays");
      defaultText = literalMD "the llamanix flake's package set";
      description = "`{ llamanix, mkVariant, mkCapabilities }` from the llamanix flake.";
    };
  };

  config = lib.mkMerge [
    (mkIf (cfg.enable && cfg.instances != { }) {
      assertions = [
        {
          assertion = builtins.elem pkgs.stdenv.hostPlatform.system llamanixLib.systems;
          message = llamanixLib.unsupportedSystem pkgs.stdenv.hostPlatform.system;
        }
      ]
      # Instance names become unit names, state directories and file names: the config's one
      # name type (core/types.py), refused here before anything is built.
      ++ map (name: {
        assertion = schemaOptions.textOk llamanixLib.schema.names.type name;
        message = "services.llamanix.instances.${builtins.toJSON name}: ${llamanixLib.schema.types.name.doc}";
      }) (lib.attrNames cfg.instances)
      # What `llamanix render` would refuse at build time, in its words, before anything is built.
      ++ map (message: {
        assertion = false;
        inherit message;
      }) (
        llamanixLib.routerProblems {
          inherit (cfg) router;
          instanceNames = lib.attrNames cfg.instances;
        }
      );

      warnings =
        lib.optional (anyCuda && !(config.hardware.graphics.enable or false)) ''
          services.llamanix: an instance uses a CUDA build but hardware.graphics.enable is off;
          enable it together with the NVIDIA driver (services.xserver.videoDrivers = [ "nvidia" ]
          and hardware.nvidia.*), or llama-server will find no GPU.
        ''
        ++ llamanixLib.firewallWarnings {
          inherit (cfg) instances router;
          inherit (config.networking) firewall;
        };

      # The units come from a package, so NixOS takes them as they are, hardening included (NixOS
      # would otherwise generate its own unit text from systemd.services). What NixOS does not do
      # for packaged units is honour their [Install] section, hence the entries below: with
      # overrideStrategy = "asDropin" each becomes only a drop-in (llamanix-NAME.service.d/) that
      # adds the llamanix.target.wants link, and a new render (a new store path) restarts the
      # instance on switch. State and cache directories are the units' StateDirectory= and
      # CacheDirectory=: systemd creates them at start, owned by the unit's dynamic user (a
      # tmpfiles rule here would create them owned by root, which DynamicUser= refuses).
      systemd.packages = [ units ];
      # A router's members are its children: they have no unit of their own.
      systemd.services =
        lib.mapAttrs' (
          name: _:
          lib.nameValuePair "llamanix-${name}" {
            overrideStrategy = "asDropin";
            wantedBy = [ "llamanix.target" ];
          }
        ) (lib.filterAttrs (name: _: !(builtins.elem name routed)) cfg.instances)
        // lib.optionalAttrs (cfg.router != null) {
          llamanix-router = {
            overrideStrategy = "asDropin";
            wantedBy = [ "llamanix.target" ];
          };
        };

      # Readiness and boot. A unit is started once its server serves (ExecStartPost=, up to
      # TimeoutStartSec=: the model's load, 20 minutes for a big one), and a target waits for the
      # units it wants. So the servers hang off a target of their own, wanted by
      # multi-user.target, without default dependencies: multi-user.target does not wait for it,
      # and it waits for none of its units. Boot starts every server and goes on; each becomes
      # active when it serves. `nixos-rebuild switch` restarts a changed unit and waits for that
      # start, as it does for every unit: it still fails when the new backend does not serve,
      # after at most that unit's TimeoutStartSec=.
      systemd.targets.llamanix = {
        description = "llama-server instances of llamanix (boot does not wait for them to serve)";
        wantedBy = [ "multi-user.target" ];
        unitConfig.DefaultDependencies = false;
      };

      networking.firewall.allowedTCPPorts = lib.unique (
        map (inst: inst.port) exposed
        ++ lib.optional (cfg.router != null && cfg.router.openFirewall) cfg.router.port
      );

      # `nix build .#nixosConfigurations.HOST.config.system.build.llamanixUnits` renders and
      # checks the units without switching anything.
      system.build.llamanixUnits = units;

      # The manifest and argv files (what `llamanix up`, `render` checks and the tests read back),
      # linked one by one, as nixpkgs' modules link their files: /etc/llamanix stays a
      # directory, where a key file may live beside them.
      environment.etc = lib.listToAttrs (
        map (file: lib.nameValuePair "llamanix/${file}" { source = "${units}/share/llamanix/${file}"; })
          (
            llamanixLib.renderedFiles {
              instanceNames = lib.attrNames cfg.instances;
              inherit (cfg) router;
              metrics = cfg.prometheus.enable;
            }
          )
      );
      environment.systemPackages = [ cfg.packageSet.llamanix ];
    })

    (mkIf (cfg.enable && gw != null) {
      assertions = [
        {
          assertion = hasLitellm;
          message = "services.llamanix.gateway: this NixOS has no services.litellm, nixpkgs' LiteLLM module, which runs the gateway (use a nixpkgs of NixOS 25.05 or later, or run the gateway on a Debian host)";
        }
        {
          assertion = gatewayRefusal == null;
          message = toString gatewayRefusal;
        }
      ];
      # validate checked the settings against the keys of the version llamanix.toml names; a
      # config that names none runs whatever nixpkgs has, without a word.
      warnings = lib.optionals hasLitellm (
        llamanixLib.firewallWarnings {
          instances = { };
          router = null;
          gateway = gw // {
            inherit (litellm) openFirewall;
          };
          inherit (config.networking) firewall;
        }
        ++ lib.optional (gw.version != null && gatewayVersion != gw.version) (
          "services.llamanix.gateway.version: llamanix.toml names LiteLLM ${gw.version}, but this "
          + "NixOS runs nixpkgs' LiteLLM ${gatewayVersion} (services.litellm.package), "
          + "which validate did not check the config against (set version = \"${gatewayVersion}\" "
          + "in [gateway], or pick a package of ${gw.version})"
        )
      );

      systemd.services.litellm = {
        # The replicas are on other hosts: ordered after the network is online, as the Debian
        # unit is (render/templates/gateway.service.j2), and after the keys are written.
        after = [
          "network-online.target"
          "${keysUnit}.service"
        ];
        wants = [ "network-online.target" ];
        requires = [ "${keysUnit}.service" ];
        startLimitIntervalSec = 600;
        startLimitBurst = 5;
        # Else LiteLLM fetches its model cost map from GitHub at every start. Set on the unit,
        # not services.litellm.environment, whose telemetry-off default a definition replaces.
        environment.LITELLM_LOCAL_MODEL_COST_MAP = "True";
        # llamanix's plugin (affinity, health checks by /health), which the settings load as a
        # callback: its directory holds that one module.
        environment.PYTHONPATH = "${../tools/llamanix/render/litellm_plugin}";
        serviceConfig = {
          # The keys, as one more EnvironmentFile= beside the one services.litellm.environmentFile
          # names: that option takes one file, and it stays the user's (provider keys, say).
          EnvironmentFile = [ llamanixLib.gatewayEnvironmentFile ];
          Restart = "on-failure";
          RestartSec = "10s";
          TimeoutStartSec = 180;
          # Started means serving: `nixos-rebuild switch` fails for a gateway that does not.
          ExecStartPost = [
            (pkgs.writeShellScript "llamanix-gateway-ready" (
              llamanixLib.gatewayReadyScript {
                gateway = gw;
                curl = lib.getExe pkgs.curl;
              }
            ))
          ];
        };
      };

      # Writes LiteLLM's environment file from the key files, loaded as credentials: the
      # files may be root's alone (agenix's /run/agenix, sops-nix's /run/secrets), no key
      # enters the store, argv or unit text. It needs no root: systemd reads the key files and
      # LiteLLM's EnvironmentFile=, so the script runs as a dynamic user with nothing but its
      # credentials and its runtime directory (`systemd-analyze security` scores it; a test
      # keeps it there).
      systemd.services.${keysUnit} = {
        description = "The keys of llamanix's LiteLLM gateway, from their files into its environment file";
        before = [ "litellm.service" ];
        # Restarting LiteLLM reads the key files again.
        partOf = [ "litellm.service" ];
        serviceConfig = {
          Type = "oneshot";
          RemainAfterExit = true;
          ExecStart = pkgs.writeShellScript "${keysUnit}" (
            llamanixLib.gatewayKeysScript (gatewayArgs // { shellArg = lib.escapeShellArg; })
          );
          LoadCredential = llamanixLib.gatewayCredentials gatewayArgs;
          RuntimeDirectory = keysUnit;
          RuntimeDirectoryMode = "0700";
          UMask = "0077";
          DynamicUser = true;
          PrivateUsers = true;
          CapabilityBoundingSet = "";
          AmbientCapabilities = "";
          NoNewPrivileges = true;
          PrivateNetwork = true;
          IPAddressDeny = "any";
          RestrictAddressFamilies = "none";
          PrivateTmp = true;
          PrivateDevices = true;
          DevicePolicy = "closed";
          PrivateIPC = true;
          ProtectSystem = "strict";
          ProtectHome = true;
          ProtectProc = "invisible";
          ProcSubset = "pid";
          ProtectClock = true;
          ProtectHostname = true;
          ProtectKernelTunables = true;
          ProtectKernelModules = true;
          ProtectKernelLogs = true;
          ProtectControlGroups = true;
          RestrictNamespaces = true;
          RestrictRealtime = true;
          RestrictSUIDSGID = true;
          LockPersonality = true;
          MemoryDenyWriteExecute = true;
          RemoveIPC = true;
          PrivateMounts = true;
          SystemCallArchitectures = "native";
          SystemCallFilter = [
            "@system-service"
            "~@privileged"
          ];
          SystemCallErrorNumber = "EPERM";
        };
      };
    })

    (lib.optionalAttrs hasLitellm {
      services.litellm = mkIf (cfg.enable && gw != null) {
        enable = true;
        inherit (gw) port;
        host = gw.listen;
        package = mkIf (gw.package != null) gw.package;
        openFirewall = mkIf (gw.openFirewall != null) gw.openFirewall;
        settings = llamanixLib.gatewaySettings gatewayArgs;
      };
    })
  ];
}
