# A stand-in for nixpkgs' lib, just large enough to evaluate nix/schema-options.nix and the
# option declarations of modules/llamanix.nix where nixpkgs is not available (CI).
#
# Option types become plain data ({ name = "nullOr"; elem = ...; }) so a test can compare them
# with schema.json; addCheck keeps its predicate so a test can call it on the schema's bounds.
# Nothing here checks values: that is nixpkgs' job, and the real module is evaluated against
# nixpkgs' lib where nixpkgs is available.
let
  type = name: attrs: { inherit name; } // attrs;
in
{
  genAttrs =
    names: f:
    builtins.listToAttrs (
      map (name: {
        inherit name;
        value = f name;
      }) names
    );
  importTOML = path: builtins.fromTOML (builtins.readFile path);
  # As nixpkgs' lib does it: a word of safe characters stays as it is.
  escapeShellArg =
    arg:
    let
      string = toString arg;
    in
    if builtins.match "[[:alnum:],._+:@%/-]+" string == null then
      "'" + builtins.replaceStrings [ "'" ] [ "'\\''" ] string + "'"
    else
      string;
  escapeShellArgs = args: builtins.concatStringsSep " " (map (arg: "'" + builtins.replaceStrings [ "'" ] [ "'\\''" ] (toString arg) + "'") args);
  licenses = {
    mit = {
      shortName = "mit";
      free = true;
    };
    nvidiaCuda = {
      shortName = "CUDA EULA";
      free = false;
    };
  };
  warn = message: builtins.trace "evaluation warning: ${message}";
  platforms.linux = [
    "x86_64-linux"
    "aarch64-linux"
  ];
  mkOption = args: { _type = "option"; } // args;
  # As nixpkgs' lib words it: the package `name` of `pkgs`, looked up only when read.
  mkPackageOption =
    pkgs: name:
    {
      extraDescription ? "",
    }:
    {
      _type = "option";
      type = type "package" { };
      default = pkgs.${name} or (throw "${name} cannot be found in pkgs");
      defaultText = {
        _type = "literalExpression";
        text = "pkgs.${name}";
      };
      description =
        "The ${name} package to use." + (if extraDescription == "" then "" else " ") + extraDescription;
    };
  mkEnableOption = what: {
    _type = "option";
    type = type "bool" { };
    default = false;
    description = "Whether to enable ${what}.";
  };
  mkDefault = content: {
    _type = "override";
    priority = 1000;
    inherit content;
  };
  mkMerge = contents: {
    _type = "merge";
    inherit contents;
  };
  mkForce = content: {
    _type = "override";
    priority = 50;
    inherit content;
  };
  mkIf = condition: content: {
    _type = "if";
    inherit condition content;
  };
  literalExpression = text: {
    _type = "literalExpression";
    inherit text;
  };
  literalMD = text: {
    _type = "literalMD";
    inherit text;
  };

  types = {
    str = type "str" { };
    int = type "int" { };
    number = type "number" { };
    bool = type "bool" { };
    package = type "package" { };
    raw = type "raw" { };
    strMatching = pattern: type "strMatching" { inherit pattern; };
    enum = values: type "enum" { inherit values; };
    nullOr = elem: type "nullOr" { inherit elem; };
    listOf = elem: type "listOf" { inherit elem; };
    nonEmptyListOf = elem: type "nonEmptyListOf" { inherit elem; };
    attrsOf = elem: type "attrsOf" { inherit elem; };
    either = left: right: type "either" { inherit left right; };
    submodule = module: type "submodule" { inherit module; };
    addCheck = elem: check: type "addCheck" { inherit elem check; };
    ints = {
      between = min: max: type "intBetween" { inherit min max; };
      unsigned = type "intUnsigned" { };
      positive = type "intPositive" { };
    };
    numbers = {
      between = min: max: type "numberBetween" { inherit min max; };
    };
  };
}
