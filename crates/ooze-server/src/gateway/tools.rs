//! Function tools as the gateway reads them from any API: the declared tools turned into chat
//! tools (`{"type": "function", "function": {name, description, parameters}}`, what the chat
//! template renders), and `tool_choice` applied. Each API says how it spells a tool
//! ([`ToolShape`]) and reads its own `tool_choice`; the checks they share are here.

use crate::error::ApiError;
use crate::lenient_json::unknown_fields;
use serde_json::{json, Value};

/// `value` as shown in an error.
pub(crate) fn shown(value: Option<&Value>) -> String {
    value.map_or("nothing".to_owned(), Value::to_string)
}

/// How an API spells a function tool.
pub(crate) struct ToolShape {
    /// A tool, as an error names what was expected.
    pub what: &'static str,
    /// Checks the tool's `type` (the tool's index, the field).
    pub check_type: fn(usize, Option<&Value>) -> Result<(), ApiError>,
    /// The key of its parameters' JSON schema, and whether it must be there.
    pub schema_key: &'static str,
    pub schema_required: bool,
}

/// `tools` as chat tools: each an object of `shape`, with a non-empty name of its own, an
/// optional string description and a JSON-schema object of parameters; other fields are
/// counted in `ignored`.
pub(crate) fn function_tools(
    tools: &[Value],
    shape: &ToolShape,
    ignored: &mut Vec<String>,
) -> Result<Vec<Value>, ApiError> {
    let mut out: Vec<Value> = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let bad = |field: &str, expected: &str, got: Option<&Value>| {
            ApiError::invalid(format!(
                "tools[{i}]{field}: expected {expected}, got {}",
                shown(got)
            ))
        };
        let Some(obj) = tool.as_object() else {
            return Err(bad("", shape.what, Some(tool)));
        };
        (shape.check_type)(i, obj.get("type"))?;
        let name = match obj.get("name").and_then(Value::as_str) {
            Some(n) if !n.trim().is_empty() => n,
            _ => return Err(bad(".name", "a non-empty string", obj.get("name"))),
        };
        if let Some(j) = out.iter().position(|t| t["function"]["name"] == name) {
            return Err(ApiError::invalid(format!(
                "tools[{i}].name: \"{name}\" is already the name of tools[{j}]"
            )));
        }
        let mut function = json!({"name": name});
        match obj.get("description") {
            None | Some(Value::Null) => {}
            Some(Value::String(d)) => function["description"] = json!(d),
            Some(other) => return Err(bad(".description", "a string", Some(other))),
        }
        match obj.get(shape.schema_key) {
            Some(schema @ Value::Object(_)) => function["parameters"] = schema.clone(),
            None | Some(Value::Null) if !shape.schema_required => {}
            got => {
                let field = format!(".{}", shape.schema_key);
                return Err(bad(&field, "a JSON schema object", got));
            }
        }
        unknown_fields(
            obj,
            &["type", "name", "description", shape.schema_key],
            "tools.*",
            ignored,
        );
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(out)
}

/// A `tool_choice` that names one tool (`name`): it must be among the tools' `names`. The
/// gateway cannot force the call, so the choice is counted as ignored and the tools rendered.
pub(crate) fn named_choice(
    name: Option<&Value>,
    names: &[&str],
    ignored: &mut Vec<String>,
) -> Result<bool, ApiError> {
    match name.and_then(Value::as_str) {
        Some(name) if names.contains(&name) => {
            ignored.push("tool_choice".to_owned());
            Ok(true)
        }
        Some(name) => Err(ApiError::invalid(format!(
            "tool_choice.name: \"{name}\" is not among the request's tools"
        ))),
        None => Err(ApiError::invalid(format!(
            "tool_choice.name: expected a string, got {}",
            shown(name)
        ))),
    }
}

/// An API's check of `tool_choice` against the declared tools' names: whether the call renders
/// its tools.
pub(crate) type RendersTools = fn(&Value, &[&str], &mut Vec<String>) -> Result<bool, ApiError>;

/// The tools a call is rendered with: those it declares (checked), unless its `tool_choice`
/// (checked against their names by the API's own `renders`) turns them off.
pub(crate) fn call_tools(
    declared: Vec<Value>,
    choice: Option<&Value>,
    ignored: &mut Vec<String>,
    renders: RendersTools,
) -> Result<Option<Vec<Value>>, ApiError> {
    crate::tool_calls::check_tools(&declared).map_err(ApiError::invalid)?;
    let rendered = match choice {
        Some(choice) => {
            let names: Vec<&str> = declared
                .iter()
                .filter_map(|t| t["function"]["name"].as_str())
                .collect();
            renders(choice, &names, ignored)?
        }
        None => true,
    };
    Ok((rendered && !declared.is_empty()).then_some(declared))
}
