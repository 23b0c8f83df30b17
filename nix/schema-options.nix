# NixOS option declarations made from tools/llamanix/data/schema.json, the one source of truth for
# llamanix.toml's keys. services.llamanix.instances.<name> therefore has exactly the TOML keys
# (same names, types, defaults and documentation), minus the ones the module sets itself
# (nix/lib.nix: instanceKeysSetByModule), plus `speculative` and the module-only options.
#
# Uses nothing from lib but mkOption and types, so CI (no nixpkgs there) evaluates it with a
# stub lib and checks the option names against schema.json (tests/test_nix.py).
{
  lib,
  schema ? (import ./lib.nix).schema,
}:
let
  inherit (lib) mkOption types;
  llamanixLib = import ./lib.nix;

  # schema minimum/maximum -> an integer type that enforces them and says so in the manual.
  intType =
    field:
    let
      min = field.minimum or null;
      max = field.maximum or null;
    in
    if min != null && max != null then
      types.ints.between min max
    else if min == 0 then
      types.ints.unsigned
    else if min == 1 then
      types.ints.positive
    else if min != null then
      types.addCheck types.int (x: x >= min)
      // {
        description = "integer, at least ${toString min}";
      }
    else
      types.int;

  floatType =
    field:
    let
      min = field.minimum or null;
      max = field.maximum or null;
    in
    if min != null && max != null then
      types.numbers.between min max
    else if min != null then
      types.addCheck types.number (x: x >= min)
      // {
        description = "number, at least ${toString min}";
      }
    else
      types.number;

  typeOf =
    field:
    let
      kind = field.type;
    in
    if kind == "str" then
      types.str
    else if kind == "path" then
      # A string, not a Nix path: a model must not be copied into the store.
      types.strMatching "/.*"
      // {
        description = "absolute path (a string)";
      }
    else if kind == "int" then
      intType field
    else if kind == "float" then
      floatType field
    else if kind == "bool" then
      types.bool
    else if kind == "enum" then
      types.enum field.values
    else if kind == "enum_list" then
      # One value, or a chain of them: written to the config as the user gave it.
      types.either (types.enum field.values) (types.nonEmptyListOf (types.enum field.values))
    else if kind == "layers" then
      types.either (intType field) (
        types.enum [
          "all"
          "auto"
        ]
      )
    else if kind == "list_str" then
      types.listOf types.str
    else if kind == "dict_str" then
      types.attrsOf types.str
    else
      throw "llamanix: schema type '${kind}' has no NixOS option type (add it to nix/schema-options.nix)";

  # null default = absent: the option is nullOr and null is not written to the config, so the
  # binary's own default applies, as when the key is left out of llamanix.toml.
  optionOf =
    field:
    let
      required = field.required or false;
      absentByDefault = field.default == null && !required;
    in
    mkOption (
      {
        type = if absentByDefault then types.nullOr (typeOf field) else typeOf field;
        description = field.doc;
      }
      // (if required then { } else { inherit (field) default; })
      // (if field ? example then { inherit (field) example; } else { })
    );

  optionsOf =
    table: leaveOut:
    builtins.listToAttrs (
      map (name: {
        inherit name;
        value = optionOf table.${name};
      }) (builtins.filter (name: !(builtins.elem name leaveOut)) (builtins.attrNames table))
    );
in
{
  instanceOptions = optionsOf schema.instances llamanixLib.instanceKeysSetByModule;
  speculativeOptions = optionsOf schema.speculative [ ];
  routerOptions = optionsOf schema.router llamanixLib.routerKeysSetByModule;
  gatewayOptions = optionsOf schema.gateway llamanixLib.gatewayKeysSetByModule;
  metricsOptions = optionsOf schema.metrics [ ];
}
