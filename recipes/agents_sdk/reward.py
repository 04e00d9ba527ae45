"""The agents_sdk recipe's reward (`[reward] type = "python"`): 1 when the last dollar amount or
number in the answer is the item's price (the label), else 0."""

import re

NUMBER = re.compile(r"\d+(?:\.\d+)?")


def price_correct(sample):
    numbers = NUMBER.findall(sample["response"])
    return float(bool(numbers) and float(numbers[-1]) == float(sample["label"]))
