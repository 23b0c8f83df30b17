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

  # A string of one of core/types.py's declared types (schema.json's `types`): the same pattern
  # (written so that Python's re.fullmatch and builtins.match read it alike), the same bound in
  # bytes, the same refused infix. tests/test_nix_types.py runs both over a table of values.
  # A string of one of core/types.py's declared types (schema.json's `types`): the same pattern
  # (written so that Python's re.fullmatch and builtins.match read it alike), the same bound in
  # bytes, the same refused infix. tests/test_types.py runs both over a table of values.
  textOk =
    kind: s:
    let
      t = schema.types.${kind};
    in
    builtins.isString s
    && builtins.match t.pattern s != null
    && builtins.stringLength s <= t.max_length
    && (if t ? forbidden then builtins.match t.forbidden s == null else true);

  textType =
    kind:
    types.addCheck (types.strMatching schema.types.${kind}.pattern) (textOk kind)
    // {
      description = "${kind}: ${schema.types.${kind}.doc} (at most ${
        toString schema.types.${kind}.max_length
      } bytes)";
    };

  # A table of strings: its values' type, and its keys checked too (attrsOf checks no names).
  tableType =
    field:
    types.addCheck (types.attrsOf (textType field.text)) (
      attrs: builtins.all (textOk field.keys) (builtins.attrNames attrs)
    )
    // {
      description = "table of ${field.text} keyed by ${field.keys}";
    };

  typeOf =
    field:
    let
      kind = field.type;
    in
    if kind == "str" || kind == "path" then
      # A path is a string, not a Nix path: a model must not be copied into the store.
      textType field.text
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
      types.listOf (textType field.text)
    else if kind == "dict_str" then
      tableType field
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
  # The type of [hosts.NAME] and [instances.NAME] names, for the module's attrsOf checks.
  nameType = textType schema.names.type;
  inherit textType textOk;
  instanceOptions = optionsOf schema.instances llamanixLib.instanceKeysSetByModule;
  speculativeOptions = optionsOf schema.speculative [ ];
  routerOptions = optionsOf schema.router llamanixLib.routerKeysSetByModule;
  gatewayOptions = optionsOf schema.gateway llamanixLib.gatewayKeysSetByModule;
  metricsOptions = optionsOf schema.metrics [ ];
}
