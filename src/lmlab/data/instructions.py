"""Forty fixed open-ended instructions, for generation demos, steering and preference experiments.

Task: follow a short everyday instruction ("Give three tips for staying healthy."). There is no reference answer:
``target`` is ``""``.

Metric: none in the quality sense. `grade` returns 1.0 when the output is non-empty (after stripping whitespace)
and 0.0 otherwise; it is a liveness check, not a measure of helpfulness or correctness. Score quality with a
reward model or a judge.

Data: `INSTRUCTIONS`, written for lmlab (not copied from any dataset). Each seed permutes them and cuts them
40/10/50 into train/dev/test (16 / 4 / 20); ``n=None`` returns the whole split. ``meta["category"]`` is a coarse
label (advice, explanation, creative, list, rewrite, reasoning).
"""

from __future__ import annotations

from typing import Any

from lmlab.data import Example, check_n, check_split, register_suite, reject_unknown, split_finite

# (id, category, instruction). Ids are stable names, so reordering this table changes no example.
INSTRUCTIONS: tuple[tuple[str, str, str], ...] = (
    ("healthy_tips", "advice", "Give three tips for staying healthy."),
    ("photosynthesis", "explanation", "Explain photosynthesis in one sentence."),
    ("sky_blue", "explanation", "Explain to a ten-year-old why the sky is blue."),
    ("haiku_autumn", "creative", "Write a haiku about autumn leaves."),
    ("study_habits", "advice", "Suggest four habits that help a student study more effectively."),
    ("thank_you_note", "creative", "Write a short thank-you note to a neighbour who watered your plants."),
    ("fruit_list", "list", "List five fruits that are high in vitamin C."),
    ("rain_story", "creative", "Write the opening two sentences of a story that begins on a rainy train platform."),
    ("recycling", "explanation", "Describe in two sentences why recycling aluminium cans saves energy."),
    ("formal_rewrite", "rewrite", "Rewrite this sentence to sound more formal: 'Hey, can you send me that file?'"),
    ("simplify_rewrite", "rewrite", "Rewrite this sentence in plain words: 'The meeting was postponed indefinitely.'"),
    ("packing_list", "list", "Make a packing list for a two-day hiking trip."),
    ("sleep_advice", "advice", "What are some ways to fall asleep faster?"),
    ("compare_cats_dogs", "explanation", "Compare cats and dogs as pets in three short points."),
    ("train_time", "reasoning", "A train leaves at 3 pm and the trip takes 2 hours 45 minutes. When does it arrive?"),
    ("email_subject", "creative", "Suggest a subject line for an email inviting colleagues to a farewell lunch."),
    ("budget_tips", "advice", "Give three simple tips for saving money on groceries."),
    ("internet_explain", "explanation", "Explain how the internet works to someone who has never used a computer."),
    ("odd_one_out", "reasoning", "Which word does not belong, and why: apple, banana, carrot, cherry?"),
    ("motivation", "creative", "Write an encouraging message for a friend who is nervous before an exam."),
    ("water_tips", "advice", "Give three tips for drinking more water during the day."),
    ("volcano", "explanation", "Explain in two sentences why volcanoes erupt."),
    ("seasons", "explanation", "Explain why the Earth has seasons."),
    ("limerick_cat", "creative", "Write a short limerick about a cat who loves boxes."),
    ("morning_routine", "advice", "Describe a simple morning routine that helps people feel more awake."),
    ("birthday_card", "creative", "Write a two-line message for a grandmother's birthday card."),
    ("vegetable_list", "list", "List four vegetables that grow well in a small garden."),
    ("museum_story", "creative", "Write the first sentence of a mystery story set in a museum at night."),
    ("bicycle_benefits", "explanation", "Describe two benefits of riding a bicycle to work."),
    ("polite_rewrite", "rewrite", "Rewrite this sentence to sound more polite: 'Give me the report now.'"),
    ("short_rewrite", "rewrite", "Shorten this sentence: 'Due to the fact that it was raining, we stayed inside.'"),
    ("picnic_list", "list", "Make a shopping list for a picnic for four people."),
    ("focus_advice", "advice", "How can someone stay focused while working from home?"),
    ("compare_tea_coffee", "explanation", "Compare tea and coffee in three short points."),
    ("apples_reasoning", "reasoning", "Anna has 12 apples and gives away a third of them. How many are left?"),
    ("team_name", "creative", "Suggest a friendly name for a neighbourhood running club."),
    ("plant_care", "advice", "Give three tips for keeping a houseplant alive."),
    ("moon_phases", "explanation", "Explain why the Moon seems to change shape over a month."),
    ("pattern_reasoning", "reasoning", "What number comes next in the sequence 2, 4, 8, 16, and why?"),
    ("welcome_message", "creative", "Write a short welcome message for a new member of a book club."),
)


def generate(n: int | None = None, seed: int = 0, split: str = "test", **unknown: Any) -> list[Example]:
    """Instruction prompts of one split.

    Args:
        n (`int`, *optional*): number of instructions; None gives the whole split.
        seed (`int`): fixes the train/dev/test partition and the order.
        split (`str`): ``"train"``, ``"dev"`` or ``"test"``.

    Returns:
        `list[Example]`: ids ``"instructions/<name>"``, ``target`` ``""``, ``meta["category"]``.
    """
    reject_unknown("instructions", unknown, ())
    check_split(split)
    table = {ident: (category, text) for ident, category, text in INSTRUCTIONS}
    keys = split_finite(sorted(table), seed, split)
    check_n(n, pool=len(keys), what=f"instructions {split} split")
    return [
        Example(f"instructions/{k}", table[k][1], "", None, {"category": table[k][0]})
        for k in (keys if n is None else keys[:n])
    ]


def grade(example: Example, output: str) -> float:
    """1.0 for a non-empty output, else 0.0 (a liveness check, not a quality metric)."""
    return 1.0 if output.strip() else 0.0


register_suite(
    "instructions",
    generate,
    grade,
    "Forty fixed open-ended instructions written for lmlab; graded only on a non-empty response.",
    metric="non_empty (not a quality metric)",
    source="written for lmlab",
)
