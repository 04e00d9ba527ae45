//! The store's database: users with addresses and payment methods, products with variants, and
//! orders with their items and payments. Generated from a seed, so a scenario names its database
//! by a number and the verifier rebuilds the same one. Money is held in cents and shown to the
//! model in dollars (`77.88`).

use ooze_core::SplitMix64;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Address {
    pub street: String,
    pub city: String,
    pub zip: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentMethod {
    pub id: String,
    /// `credit_card`, `gift_card` or `paypal`.
    pub kind: String,
    /// A gift card's balance, in cents.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "money_option"
    )]
    pub balance: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    pub user_id: String,
    pub first_name: String,
    pub last_name: String,
    pub email: String,
    pub address: Address,
    pub payment_methods: Vec<PaymentMethod>,
    pub orders: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Variant {
    pub item_id: String,
    pub options: BTreeMap<String, String>,
    #[serde(with = "money")]
    pub price: i64,
    pub available: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Product {
    pub product_id: String,
    pub name: String,
    pub variants: Vec<Variant>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrderItem {
    pub item_id: String,
    pub product_id: String,
    pub name: String,
    pub options: BTreeMap<String, String>,
    #[serde(with = "money")]
    pub price: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payment {
    /// `payment` or `refund`.
    pub kind: String,
    #[serde(with = "money")]
    pub amount: i64,
    pub payment_method_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    pub order_id: String,
    pub user_id: String,
    pub address: Address,
    pub items: Vec<OrderItem>,
    /// `pending`, `delivered`, `cancelled`, `return requested` or `exchange requested`.
    pub status: String,
    pub payments: Vec<Payment>,
    /// What a cancellation, return or exchange recorded (reason, items, new items, method).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub request: BTreeMap<String, serde_json::Value>,
}

impl Order {
    /// What was paid for the items.
    pub fn total(&self) -> i64 {
        self.items.iter().map(|i| i.price).sum()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Database {
    pub users: BTreeMap<String, User>,
    pub products: BTreeMap<String, Product>,
    pub orders: BTreeMap<String, Order>,
}

/// Cents as a JSON number of dollars.
mod money {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(cents: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(*cents as f64 / 100.0)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        Ok((f64::deserialize(d)? * 100.0).round() as i64)
    }
}

mod money_option {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(cents: &Option<i64>, s: S) -> Result<S::Ok, S::Error> {
        match cents {
            Some(c) => super::money::serialize(c, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.map(|f| (f * 100.0).round() as i64))
    }
}

/// `$12.34`.
pub fn dollars(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    format!("{sign}${}.{:02}", cents.abs() / 100, cents.abs() % 100)
}

const FIRST: &[&str] = &[
    "Ava", "Liam", "Mia", "Noah", "Zoe", "Omar", "Lena", "Ivan", "Sara", "Yuki", "Raj", "Emma",
    "Lucas", "Nora", "Amir", "Chloe",
];
const LAST: &[&str] = &[
    "Kim", "Silva", "Moreau", "Novak", "Garcia", "Patel", "Jensen", "Rossi", "Smith", "Tanaka",
    "Okafor", "Lopez", "Weber", "Ahmed",
];
const CITIES: &[&str] = &[
    "Denver", "Austin", "Boston", "Seattle", "Portland", "Phoenix", "Dallas", "Chicago",
];
const STREETS: &[&str] = &[
    "Oak St",
    "Elm Ave",
    "Pine Rd",
    "Maple Dr",
    "Cedar Ln",
    "Lake Blvd",
];

/// A product kind: its name, two options with their values, and a base price in dollars.
struct Kind {
    name: &'static str,
    options: [(&'static str, &'static [&'static str]); 2],
    dollars: i64,
}

const KINDS: &[Kind] = &[
    Kind {
        name: "T-Shirt",
        options: [
            ("color", &["red", "blue", "black", "white"]),
            ("size", &["S", "M", "L", "XL"]),
        ],
        dollars: 25,
    },
    Kind {
        name: "Water Bottle",
        options: [
            ("capacity", &["500ml", "750ml", "1000ml"]),
            ("color", &["green", "blue", "black"]),
        ],
        dollars: 18,
    },
    Kind {
        name: "Desk Lamp",
        options: [
            ("color", &["white", "black", "silver"]),
            ("brightness", &["low", "medium", "high"]),
        ],
        dollars: 40,
    },
    Kind {
        name: "Backpack",
        options: [
            ("color", &["grey", "navy", "black"]),
            ("size", &["small", "medium", "large"]),
        ],
        dollars: 60,
    },
    Kind {
        name: "Headphones",
        options: [
            ("type", &["in-ear", "over-ear", "on-ear"]),
            ("color", &["black", "white", "red"]),
        ],
        dollars: 80,
    },
    Kind {
        name: "Sneakers",
        options: [
            ("size", &["8", "9", "10", "11"]),
            ("color", &["white", "black", "blue"]),
        ],
        dollars: 70,
    },
];

/// Users in a generated database.
pub const USERS: usize = 10;

fn digits(rng: &mut SplitMix64, n: u32) -> String {
    let lo = 10u64.pow(n - 1);
    (lo + rng.below(9 * lo)).to_string()
}

impl Database {
    /// The database of `seed`: every product kind with four variants (some out of stock),
    /// [`USERS`] users with one to three payment methods and two or three orders each.
    pub fn generate(seed: u64) -> Database {
        let mut rng = SplitMix64::new(seed ^ 0x7e7a_11db);
        let mut products = BTreeMap::new();
        let mut item_ids = std::collections::HashSet::new();
        for kind in KINDS {
            let [(o1, v1), (o2, v2)] = kind.options;
            let product_id = digits(&mut rng, 6);
            let mut variants: Vec<Variant> = Vec::new();
            while variants.len() < 4 {
                let options = BTreeMap::from([
                    (o1.to_string(), rng.pick(v1).to_string()),
                    (o2.to_string(), rng.pick(v2).to_string()),
                ]);
                if variants.iter().any(|v| v.options == options) {
                    continue;
                }
                let mut item_id = digits(&mut rng, 6);
                while !item_ids.insert(item_id.clone()) {
                    item_id = digits(&mut rng, 6);
                }
                variants.push(Variant {
                    item_id,
                    options,
                    price: kind.dollars * 100 + rng.range(-500, 500),
                    available: rng.below(5) > 0,
                });
            }
            products.insert(
                product_id.clone(),
                Product {
                    product_id,
                    name: kind.name.to_string(),
                    variants,
                },
            );
        }
        let mut users = BTreeMap::new();
        let mut orders = BTreeMap::new();
        let product_ids: Vec<String> = products.keys().cloned().collect();
        while users.len() < USERS {
            let (first, last) = (rng.pick(FIRST).to_string(), rng.pick(LAST).to_string());
            let user_id = format!(
                "{}_{}_{}",
                first.to_lowercase(),
                last.to_lowercase(),
                digits(&mut rng, 4)
            );
            if users.contains_key(&user_id) {
                continue;
            }
            let address = Address {
                street: format!("{} {}", 10 + rng.below(990), rng.pick(STREETS)),
                city: rng.pick(CITIES).to_string(),
                zip: digits(&mut rng, 5),
            };
            let mut payment_methods = Vec::new();
            for kind in ["credit_card", "gift_card", "paypal"] {
                if payment_methods.is_empty() || rng.below(2) == 0 {
                    payment_methods.push(PaymentMethod {
                        id: format!("{kind}_{}", digits(&mut rng, 5)),
                        kind: kind.to_string(),
                        balance: (kind == "gift_card").then(|| 100 * rng.range(10, 300)),
                    });
                }
            }
            let email = format!(
                "{}.{}{}@example.com",
                first.to_lowercase(),
                last.to_lowercase(),
                rng.below(100)
            );
            if users.values().any(|u: &User| u.email == email) {
                continue;
            }
            let mut user = User {
                email,
                user_id: user_id.clone(),
                first_name: first,
                last_name: last,
                address: address.clone(),
                payment_methods,
                orders: Vec::new(),
            };
            for _ in 0..2 + rng.below(2) {
                let mut order_id = format!("#W{}", digits(&mut rng, 5));
                while orders.contains_key(&order_id) {
                    order_id = format!("#W{}", digits(&mut rng, 5));
                }
                let mut items: Vec<OrderItem> = Vec::new();
                for _ in 0..1 + rng.below(3) {
                    let product = &products[rng.pick(&product_ids)];
                    if items.iter().any(|i| i.product_id == product.product_id) {
                        continue;
                    }
                    let v = rng.pick(&product.variants);
                    items.push(OrderItem {
                        item_id: v.item_id.clone(),
                        product_id: product.product_id.clone(),
                        name: product.name.clone(),
                        options: v.options.clone(),
                        price: v.price,
                    });
                }
                let paid_with = rng.pick(&user.payment_methods).id.clone();
                let order = Order {
                    order_id: order_id.clone(),
                    user_id: user_id.clone(),
                    address: address.clone(),
                    status: if rng.below(2) == 0 {
                        "pending"
                    } else {
                        "delivered"
                    }
                    .to_string(),
                    payments: vec![Payment {
                        kind: "payment".into(),
                        amount: items.iter().map(|i| i.price).sum(),
                        payment_method_id: paid_with,
                    }],
                    items,
                    request: BTreeMap::new(),
                };
                user.orders.push(order_id.clone());
                orders.insert(order_id, order);
            }
            users.insert(user_id, user);
        }
        Database {
            users,
            products,
            orders,
        }
    }

    /// The user who has `email`.
    pub fn user_by_email(&self, email: &str) -> Option<&User> {
        self.users
            .values()
            .find(|u| u.email.eq_ignore_ascii_case(email.trim()))
    }

    /// The product variant `item_id` with its product.
    pub fn variant(&self, item_id: &str) -> Option<(&Product, &Variant)> {
        self.products.values().find_map(|p| {
            p.variants
                .iter()
                .find(|v| v.item_id == item_id)
                .map(|v| (p, v))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_a_function_of_the_seed() {
        let a = Database::generate(7);
        assert_eq!(a, Database::generate(7));
        assert_ne!(a, Database::generate(8));
        assert_eq!(a.users.len(), USERS);
        assert_eq!(a.products.len(), KINDS.len());
        for u in a.users.values() {
            assert!((2..=3).contains(&u.orders.len()), "{u:?}");
            assert!(!u.payment_methods.is_empty());
            for o in &u.orders {
                let order = &a.orders[o];
                assert_eq!(order.user_id, u.user_id);
                assert!(!order.items.is_empty());
                assert_eq!(order.payments[0].amount, order.total());
                for item in &order.items {
                    let (p, v) = a.variant(&item.item_id).unwrap();
                    assert_eq!((&p.product_id, v.price), (&item.product_id, item.price));
                }
            }
        }
        assert_eq!(dollars(12345), "$123.45");
        // Shown in dollars, read back exactly.
        let text = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<Database>(&text).unwrap(), a);
        let order = a.orders.values().next().unwrap();
        let shown = serde_json::to_value(order).unwrap();
        assert_eq!(
            shown["payments"][0]["amount"].as_f64().unwrap(),
            order.total() as f64 / 100.0
        );
        assert_eq!(dollars(-5), "-$0.05");
    }
}
