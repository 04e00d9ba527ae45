//! The tools the agent calls on the store's database: lookups, and the actions that change it
//! (cancel, change an address, return, exchange), each checked against the store's rules. A
//! result is JSON text for the model; a refused call is an error message for it, and changes
//! nothing.

use super::db::{dollars, Address, Database, Order, Payment};
use serde_json::{json, Map, Value};

/// The tools: each name with its parameters, as the policy document lists them (its rules say
/// what the changes do).
pub const TOOLS: &[(&str, &[&str])] = &[
    ("find_user_id_by_email", &["email"]),
    (
        "find_user_id_by_name_zip",
        &["first_name", "last_name", "zip"],
    ),
    ("get_user_details", &["user_id"]),
    ("get_order_details", &["order_id"]),
    ("get_product_details", &["product_id"]),
    ("list_all_product_types", &[]),
    ("cancel_pending_order", &["order_id", "reason"]),
    (
        "modify_pending_order_address",
        &["order_id", "street", "city", "zip"],
    ),
    ("modify_user_address", &["user_id", "street", "city", "zip"]),
    (
        "return_delivered_order_items",
        &["order_id", "item_ids", "payment_method_id"],
    ),
    (
        "exchange_delivered_order_items",
        &["order_id", "item_ids", "new_item_ids", "payment_method_id"],
    ),
    ("transfer_to_human_agents", &["summary"]),
];

/// The reasons a cancellation may give.
pub const CANCEL_REASONS: [&str; 2] = ["no longer needed", "ordered by mistake"];

/// The tool list for the policy document: `name(params)`, comma-separated.
pub fn tools_text() -> String {
    TOOLS
        .iter()
        .map(|(name, params)| format!("{name}({})", params.join(", ")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Calls tool `name` on `db`. `Err` is a refusal worded for the model.
pub fn call(db: &mut Database, name: &str, args: &Map<String, Value>) -> Result<String, String> {
    let (_, params) = TOOLS.iter().find(|(n, _)| *n == name).ok_or_else(|| {
        format!(
            "unknown tool \"{name}\"; the tools are {}",
            TOOLS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
        )
    })?;
    let a = Args { tool: name, args };
    for p in *params {
        if !args.contains_key(*p) {
            return Err(format!("{name} needs the argument \"{p}\""));
        }
    }
    match name {
        "find_user_id_by_email" => {
            let email = a.str("email")?;
            db.user_by_email(email)
                .map(|u| u.user_id.clone())
                .ok_or_else(|| format!("no customer has the email {email}"))
        }
        "find_user_id_by_name_zip" => {
            let (first, last, zip) = (a.str("first_name")?, a.str("last_name")?, a.str("zip")?);
            db.users
                .values()
                .find(|u| {
                    u.first_name.eq_ignore_ascii_case(first.trim())
                        && u.last_name.eq_ignore_ascii_case(last.trim())
                        && u.address.zip == zip.trim()
                })
                .map(|u| u.user_id.clone())
                .ok_or_else(|| format!("no customer is named {first} {last} with zip {zip}"))
        }
        "get_user_details" => Ok(json(db.users.get(a.str("user_id")?).ok_or("no such user")?)),
        "get_order_details" => Ok(json(order(db, a.str("order_id")?)?)),
        "get_product_details" => Ok(json(
            db.products
                .get(a.str("product_id")?)
                .ok_or("no such product")?,
        )),
        "list_all_product_types" => {
            let types: Map<String, Value> = db
                .products
                .values()
                .map(|p| (p.name.clone(), Value::String(p.product_id.clone())))
                .collect();
            Ok(Value::Object(types).to_string())
        }
        "cancel_pending_order" => cancel(db, a.str("order_id")?, a.str("reason")?),
        "modify_pending_order_address" => {
            let address = a.address()?;
            let o = order_mut(db, a.str("order_id")?)?;
            if o.status != "pending" {
                return Err(format!("order {} is {}, not pending", o.order_id, o.status));
            }
            o.address = address;
            Ok(json(&*o))
        }
        "modify_user_address" => {
            let address = a.address()?;
            let user = db.users.get_mut(a.str("user_id")?).ok_or("no such user")?;
            user.address = address;
            Ok(json(&*user))
        }
        "return_delivered_order_items" => give_back(db, &a),
        "exchange_delivered_order_items" => exchange(db, &a),
        "transfer_to_human_agents" => Ok("Transfer successful".into()),
        _ => unreachable!("every listed tool is handled"),
    }
}

/// Whether tool `name` changes the database.
pub fn writes(name: &str) -> bool {
    matches!(
        name,
        "cancel_pending_order"
            | "modify_pending_order_address"
            | "modify_user_address"
            | "return_delivered_order_items"
            | "exchange_delivered_order_items"
    )
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("database records serialise")
}

struct Args<'a> {
    tool: &'a str,
    args: &'a Map<String, Value>,
}

impl Args<'_> {
    fn str(&self, key: &str) -> Result<&str, String> {
        self.args[key]
            .as_str()
            .ok_or_else(|| format!("argument \"{key}\" of {} must be a string", self.tool))
    }

    fn strs(&self, key: &str) -> Result<Vec<String>, String> {
        let list = self.args[key]
            .as_array()
            .ok_or_else(|| format!("argument \"{key}\" of {} must be a list", self.tool))?;
        list.iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| format!("argument \"{key}\" of {} must list strings", self.tool))
            })
            .collect()
    }

    fn address(&self) -> Result<Address, String> {
        Ok(Address {
            street: self.str("street")?.trim().to_owned(),
            city: self.str("city")?.trim().to_owned(),
            zip: self.str("zip")?.trim().to_owned(),
        })
    }
}

fn order<'d>(db: &'d Database, id: &str) -> Result<&'d Order, String> {
    db.orders
        .get(id.trim())
        .ok_or_else(|| format!("no order {id}"))
}

fn order_mut<'d>(db: &'d mut Database, id: &str) -> Result<&'d mut Order, String> {
    db.orders
        .get_mut(id.trim())
        .ok_or_else(|| format!("no order {id}"))
}

fn cancel(db: &mut Database, order_id: &str, reason: &str) -> Result<String, String> {
    if !CANCEL_REASONS.contains(&reason) {
        return Err(format!(
            "reason must be \"{}\" or \"{}\"",
            CANCEL_REASONS[0], CANCEL_REASONS[1]
        ));
    }
    let o = order(db, order_id)?;
    if o.status != "pending" {
        return Err(format!("order {} is {}, not pending", o.order_id, o.status));
    }
    let (user_id, paid) = (o.user_id.clone(), o.payments.clone());
    for p in paid.iter().filter(|p| p.kind == "payment") {
        refund_to(db, &user_id, &p.payment_method_id, p.amount);
    }
    let o = order_mut(db, order_id)?;
    o.payments.extend(
        paid.iter()
            .filter(|p| p.kind == "payment")
            .map(|p| Payment {
                kind: "refund".into(),
                ..p.clone()
            }),
    );
    o.status = "cancelled".into();
    o.request.insert("reason".into(), json!(reason));
    Ok(json(&*o))
}

/// A gift card's refund is on its balance at once.
fn refund_to(db: &mut Database, user_id: &str, method: &str, amount: i64) {
    if let Some(m) = db
        .users
        .get_mut(user_id)
        .and_then(|u| u.payment_methods.iter_mut().find(|m| m.id == method))
    {
        if let Some(balance) = &mut m.balance {
            *balance += amount;
        }
    }
}

/// The delivered order of `a`'s `order_id` and its `item_ids`, each an item of it (a repeated
/// id needs as many such items).
fn delivered_items(db: &Database, a: &Args<'_>) -> Result<(Order, Vec<String>), String> {
    let o = order(db, a.str("order_id")?)?;
    if o.status != "delivered" {
        return Err(format!(
            "order {} is {}, not delivered",
            o.order_id, o.status
        ));
    }
    let items = a.strs("item_ids")?;
    if items.is_empty() {
        return Err("item_ids is empty".into());
    }
    let mut left: Vec<&str> = o.items.iter().map(|i| i.item_id.as_str()).collect();
    for item in &items {
        let at = left
            .iter()
            .position(|i| i == item)
            .ok_or_else(|| format!("item {item} is not (or not that many times) in the order"))?;
        left.remove(at);
    }
    Ok((o.clone(), items))
}

fn give_back(db: &mut Database, a: &Args<'_>) -> Result<String, String> {
    let (o, items) = delivered_items(db, a)?;
    let method = a.str("payment_method_id")?;
    let original = o.payments.iter().any(|p| p.payment_method_id == method);
    let gift_card = db.users[&o.user_id]
        .payment_methods
        .iter()
        .any(|m| m.id == method && m.kind == "gift_card");
    if !original && !gift_card {
        return Err(format!(
            "{method} is neither the order's payment method nor a gift card of the customer"
        ));
    }
    let o = order_mut(db, &o.order_id)?;
    o.status = "return requested".into();
    o.request.insert("return_items".into(), json!(items));
    o.request.insert("payment_method_id".into(), json!(method));
    Ok(json(&*o))
}

fn exchange(db: &mut Database, a: &Args<'_>) -> Result<String, String> {
    let (o, items) = delivered_items(db, a)?;
    let new_items = a.strs("new_item_ids")?;
    if new_items.len() != items.len() {
        return Err("item_ids and new_item_ids must be as long".into());
    }
    let mut difference = 0;
    for (old, new) in items.iter().zip(&new_items) {
        let old = o
            .items
            .iter()
            .find(|i| &i.item_id == old)
            .expect("checked above");
        let (product, variant) = db.variant(new).ok_or_else(|| format!("no item {new}"))?;
        if product.product_id != old.product_id {
            return Err(format!(
                "item {new} is a {}, not a {}",
                product.name, old.name
            ));
        }
        if variant.item_id == old.item_id || !variant.available {
            return Err(format!(
                "item {new} is {}",
                if variant.available {
                    "the same item"
                } else {
                    "not available"
                }
            ));
        }
        difference += variant.price - old.price;
    }
    let method = a.str("payment_method_id")?;
    let user = &db.users[&o.user_id];
    let m = user
        .payment_methods
        .iter()
        .find(|m| m.id == method)
        .ok_or_else(|| format!("{method} is not a payment method of the customer"))?;
    if m.balance.is_some_and(|b| b < difference) {
        return Err(format!(
            "the gift card's balance does not cover the difference of {}",
            dollars(difference)
        ));
    }
    let o = order_mut(db, &o.order_id)?;
    o.status = "exchange requested".into();
    o.request.insert("exchange_items".into(), json!(items));
    o.request.insert("new_items".into(), json!(new_items));
    o.request.insert("payment_method_id".into(), json!(method));
    o.request
        .insert("price_difference".into(), json!(dollars(difference)));
    Ok(json(&*o))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn lookups_and_refusals() {
        let mut db = Database::generate(3);
        let user = db.users.values().next().unwrap().clone();
        let id = call(
            &mut db,
            "find_user_id_by_email",
            &args(json!({"email": user.email.to_uppercase()})),
        )
        .unwrap();
        assert_eq!(id, user.user_id);
        let by_name = json!({"first_name": user.first_name, "last_name": user.last_name,
                             "zip": user.address.zip});
        assert_eq!(
            call(&mut db, "find_user_id_by_name_zip", &args(by_name)).unwrap(),
            user.user_id
        );
        let e = call(&mut db, "get_order_details", &args(json!({}))).unwrap_err();
        assert!(e.contains("needs the argument \"order_id\""), "{e}");
        let e = call(&mut db, "fly", &args(json!({}))).unwrap_err();
        assert!(
            e.contains("unknown tool \"fly\"") && e.contains("get_user_details"),
            "{e}"
        );
        let before = db.clone();
        // Refusals change nothing.
        let delivered = db
            .orders
            .values()
            .find(|o| o.status == "delivered")
            .unwrap();
        let d = delivered.order_id.clone();
        let e = call(
            &mut db,
            "cancel_pending_order",
            &args(json!({"order_id": d, "reason": "no longer needed"})),
        )
        .unwrap_err();
        assert!(e.contains("not pending"), "{e}");
        let e = call(
            &mut db,
            "return_delivered_order_items",
            &args(json!({"order_id": d, "item_ids": ["000000"], "payment_method_id": "x"})),
        )
        .unwrap_err();
        assert!(
            e.contains("not (or not that many times) in the order"),
            "{e}"
        );
        assert_eq!(db, before);
    }

    #[test]
    fn cancelling_refunds_every_payment() {
        let mut db = Database::generate(5);
        let o = db
            .orders
            .values()
            .find(|o| o.status == "pending")
            .unwrap()
            .clone();
        let e = call(
            &mut db,
            "cancel_pending_order",
            &args(json!({"order_id": o.order_id, "reason": "too pricey"})),
        )
        .unwrap_err();
        assert!(e.contains("reason must be"), "{e}");
        call(
            &mut db,
            "cancel_pending_order",
            &args(json!({"order_id": o.order_id, "reason": "ordered by mistake"})),
        )
        .unwrap();
        let after = &db.orders[&o.order_id];
        assert_eq!(after.status, "cancelled");
        assert_eq!(after.payments.len(), 2);
        assert_eq!(after.payments[1].kind, "refund");
        assert_eq!(after.payments[1].amount, o.total());
    }
}
