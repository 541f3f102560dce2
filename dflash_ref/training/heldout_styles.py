"""A second held-out set, written by hand: prompts in styles that no training prompt written here uses
(neither prompts.TEMPLATES nor varied_prompts.STYLES), each on a topic that is none of prompts.TOPICS
(an everyday word of TOPICS, "milk" or "time", may still occur in its text). It asks what a
draft learnt beyond the shapes of answer it was trained on; the template held-out set (prompts.py) asks
only about unseen topics. `train` evaluates the first --eval-styles of them beside its held-out prompts
(eval.json's "heldout_styles"), `evaluate --sets heldout-styles:0:48` any slice.

    heldout_styles()[i] = the (i div S)-th prompt of style i mod S          (S styles, 4 prompts each)

so any first n spread over the styles. No torch here.
"""

from __future__ import annotations

WRITTEN = {  # style: [(topic, prompt), …]; no topic is one of prompts.TOPICS
    "grammar fix": [
        (
            "a lost umbrella",
            'Fix the grammar and spelling: "me and him goes to the shop yesterday but we forgets '
            'the umbrela at the counter"',
        ),
        (
            "a broken printer",
            'Correct the mistakes in this note: "The printer on second floor dont work since '
            'monday, please somebody fixes it."',
        ),
        (
            "a garden party",
            'Please correct this sentence: "Their going to the garden party tomorow, weather or not it rain."',
        ),
        (
            "a job application",
            'Fix the errors: "I has five year of experience and I am very motivate to joining you\'re team."',
        ),
    ],
    "translation": [
        ("a train ticket", 'Translate into French: "Where can I buy a ticket for the next train to the coast?"'),
        ("a hotel room", 'Translate into Spanish: "Could we have a quiet room away from the lift, please?"'),
        ("a lost dog", 'Translate into German: "Our small brown dog ran away this morning near the bakery."'),
        (
            "a dinner invitation",
            'How would you say this in Italian: "Would you like to have dinner with us on Saturday?"',
        ),
    ],
    "email reply": [
        (
            "a late delivery",
            'Write a reply to this email from a customer: "My order was supposed to arrive '
            'last Friday and it still has not come. What is going on?"',
        ),
        (
            "a team lunch",
            'My colleague wrote: "Are you free for a team lunch on Wednesday at noon?" Write a '
            "polite reply saying I can only come at one.",
        ),
        (
            "a rent increase",
            'Reply to my landlord\'s message, "The rent will go up by ten percent next month", '
            "asking politely whether we can discuss it.",
        ),
        (
            "a borrowed ladder",
            'Write a short, friendly answer to my neighbour, who asked: "Could I borrow your ladder this weekend?"',
        ),
    ],
    "continue dialogue": [
        (
            "a missed bus",
            "Continue this conversation for four more lines.\nAnna: I missed the bus again.\n"
            "Ben: That's the third time this week!\nAnna:",
        ),
        (
            "a new haircut",
            "Carry on this dialogue:\nSam: Do you like my new haircut?\nLee: It's... very different.\nSam:",
        ),
        (
            "a burnt cake",
            "Finish the conversation:\nMum: What is that smell?\nTom: Nothing! Everything is fine "
            "in the kitchen.\nMum:",
        ),
        (
            "a flat tyre",
            "Write what happens next in this exchange:\nDriver: I think we have a flat tyre.\n"
            "Passenger: Do you know how to change it?\nDriver:",
        ),
    ],
    "feedback on writing": [
        (
            "an essay opening",
            'Give me feedback on the first line of my essay: "Since the dawn of time, humans '
            'have always wanted to be happy."',
        ),
        (
            "a cover letter",
            'Is this a good opening for a cover letter? "To whom it may concern, I am writing to '
            'apply for the job I saw." How could it be better?',
        ),
        (
            "a wedding speech",
            "Here is the start of my wedding speech: \"I've known Mark for twenty years, and "
            'most of them he owed me money." Is it too harsh?',
        ),
        (
            "a shop slogan",
            'What do you think of this slogan for my bike repair shop: "We fix it, you ride it"? Be honest.',
        ),
    ],
    "headline": [
        (
            "a town fountain",
            "Write a headline for this news: the town has switched its old fountain back on "
            "after forty years, and hundreds came to watch.",
        ),
        ("a record pumpkin", "Suggest a catchy headline: a farmer grew a pumpkin weighing more than a small car."),
        ("a school choir", "Give three possible headlines for a story about a school choir that won a national prize."),
        (
            "a lost wallet",
            "Write a newspaper headline: a taxi driver returned a wallet with a large sum of cash to its owner.",
        ),
    ],
    "name brainstorm": [
        ("a bakery", "Suggest five names for a small bakery that only sells sourdough bread."),
        ("a podcast", "I'm starting a podcast about old board-game rules. Give me six possible names."),
        ("a kitten", "We just adopted a grey kitten with white paws. What could we name her?"),
        ("a rowing team", "Brainstorm names for a rowing team made up of retired teachers."),
    ],
    "sentiment": [
        (
            "a restaurant review",
            'Is this review positive, negative or mixed? "The soup was cold, but the '
            'waiter was lovely and the dessert saved the evening."',
        ),
        (
            "a phone review",
            'Classify the feeling of this sentence: "Battery lasts two days, best purchase I\'ve made this year."',
        ),
        ("a hotel review", 'Positive or negative? "The view was nice, I suppose, if you like car parks."'),
        ("a film review", 'What is the tone of this comment: "Three hours long and I still wanted more."'),
    ],
    "troubleshooting": [
        (
            "a leaking tap",
            "My kitchen tap keeps dripping even when it is turned off tightly. What might be "
            "wrong, and what can I check first?",
        ),
        ("a slow laptop", "My laptop has become very slow to start in the last month. What should I try, in order?"),
        (
            "a sourdough starter",
            "My sourdough starter smells like nail polish and is not rising. What am I doing wrong?",
        ),
        ("a squeaky door", "The door to my bedroom squeaks loudly every time I open it. How do I stop it?"),
    ],
    "day plan": [
        ("a rainy Sunday", "Plan a rainy Sunday at home for two adults and a five-year-old, hour by hour."),
        ("an exam week", "Make me a study plan for the week before an exam, with breaks."),
        ("a moving day", "We are moving flat on Saturday. Write a schedule for the day from 7 a.m. to 9 p.m."),
        ("a first marathon", "Draft a four-week plan to get ready for a first 10 km fun run."),
    ],
    "riddle": [
        ("a shadow", 'Make up a riddle whose answer is "a shadow".'),
        ("a key", "Write a riddle for children where the answer is a key."),
        ("an echo", "Invent a short riddle about an echo, and give the answer at the end."),
        ("a candle flame", "Create a rhyming riddle whose answer is a candle flame."),
    ],
    "extraction": [
        (
            "a meeting note",
            'List every date mentioned here: "We met on 3 May, agreed to send the draft by 10 '
            'June, and will review it again on 1 July."',
        ),
        (
            "a shopping message",
            'Pull out the items to buy from this message: "Can you grab milk, two onions, '
            'and whatever bread looks fresh? Oh, and batteries."',
        ),
        (
            "a travel booking",
            'From this text, extract the names of the people and the cities: "Maria flies '
            'from Lisbon to Oslo, and Jonas joins her in Bergen."',
        ),
        (
            "a recipe card",
            'Which quantities appear in this line: "Mix 200 g flour, 3 eggs and half a litre of '
            'milk"? Give them as a list.',
        ),
    ],
}


def heldout_styles() -> list[str]:
    """The hand-written held-out prompts, interleaved by style (the module's docstring)."""
    per_style = [[prompt for _, prompt in entries] for entries in WRITTEN.values()]
    return [group[i] for i in range(max(map(len, per_style))) for group in per_style if i < len(group)]


def style_of_heldout(prompt: str) -> str:
    """The style a hand-written held-out prompt is in; ValueError for another prompt."""
    for style, entries in WRITTEN.items():
        if any(prompt == p for _, p in entries):
            return style
    raise ValueError(f"{prompt[:60]!r} is none of the hand-written held-out prompts (heldout_styles.WRITTEN)")


def heldout_topics() -> list[str]:
    return [topic for entries in WRITTEN.values() for topic, _ in entries]
