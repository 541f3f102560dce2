"""The prompts written here for self-distillation (no download), split by topic so that the
held-out prompts are unseen in training:

    prompts = TEMPLATES × TOPICS, both hand-written below; the last HELD_OUT_TOPICS topics are held out

No torch here: the command line reads these while it is built.
"""
from __future__ import annotations

TOPICS = [
    # nature and science
    "the sea", "volcanoes", "the moon", "bees", "rainbows", "photosynthesis", "gravity", "clouds", "elephants",
    "electricity", "mountains", "penguins", "the solar system", "rivers", "winter", "dinosaurs", "the ocean tides",
    "forests", "water", "deserts", "earthquakes", "the sun", "stars", "butterflies", "whales", "frogs", "owls",
    "lightning", "snow", "wind", "spiders", "ants", "sharks", "coral reefs", "rainforests", "lakes", "glaciers",
    "magnets", "light", "sound", "atoms", "cells", "DNA", "bacteria", "the weather", "seasons", "tigers", "horses",
    "dolphins", "wolves", "trees", "flowers", "mushrooms", "rocks", "fossils", "the sky", "planets", "comets",
    # people, places and history
    "the Roman Empire", "ancient Egypt", "the pyramids", "castles", "pirates", "knights", "the Vikings", "maps",
    "cities", "villages", "islands", "farms", "museums", "libraries", "schools", "hospitals", "markets",
    # everyday life
    "coffee", "tea", "bread", "honey", "cheese", "rice", "chocolate", "apples", "soup", "breakfast", "cooking",
    "gardening", "recycling", "friendship", "family", "sleep", "exercise", "walking", "swimming", "running",
    "birthdays", "holidays", "shoes", "clocks", "money", "letters", "cats", "dogs", "pets", "kindness",
    # technology and transport
    "trains", "bicycles", "airplanes", "cars", "ships", "bridges", "rockets", "computers", "the internet", "robots",
    "phones", "cameras", "batteries", "solar panels", "windmills", "the printing press", "paper", "the alphabet",
    "the telephone", "the wheel", "electric cars", "satellites",
    # arts, games and ideas
    "music", "chess", "soccer", "painting", "dancing", "poetry", "books", "movies", "theater", "the piano",
    "the guitar", "drawing", "photography", "basketball", "tennis", "the Olympic Games", "puzzles", "board games",
    "mathematics", "numbers", "history", "languages", "science", "art", "time", "happiness", "courage", "patience",
    # more training topics, so that the first 1860 prompts cover all 595 training topics, not 155: the held-out topics
    # are unseen, and a draft trained on few topics learns those topics' answers
    # nature and science (more)
    "hurricanes", "tornadoes", "caves", "waterfalls", "the Arctic", "Antarctica", "the Amazon river", "canyons",
    "sand dunes", "hot springs", "geysers", "tsunamis", "fog", "hail", "the northern lights", "eclipses", "meteors",
    "black holes", "galaxies", "the Milky Way", "Mars", "Jupiter", "Saturn's rings", "asteroids",
    "the speed of light", "magnetism", "friction", "energy", "heat", "temperature", "oxygen", "carbon", "iron",
    "gold", "diamonds", "crystals", "salt", "sugar", "plastic", "glass", "steel", "wood", "cotton", "wool", "silk",
    "rubber", "soil", "seeds", "roots", "leaves", "grass", "cactus plants", "bamboo", "oak trees", "pine trees",
    "roses", "sunflowers", "tulips", "moss", "algae", "plankton", "jellyfish", "octopuses", "squid", "crabs",
    "lobsters", "starfish", "sea turtles", "seals", "walruses", "polar bears", "penguin chicks", "eagles", "parrots",
    "hummingbirds", "crows", "pigeons", "flamingos", "peacocks", "swans", "ducks", "chickens", "cows", "sheep",
    "goats", "pigs", "rabbits", "mice", "squirrels", "hedgehogs", "bats", "beavers", "otters", "raccoons", "bears",
    "lions", "cheetahs", "leopards", "zebras", "giraffes", "hippos", "rhinos", "camels", "gorillas", "chimpanzees",
    "pandas", "koalas", "sloths", "snakes", "lizards", "crocodiles", "turtles", "snails", "worms", "ladybugs",
    "dragonflies", "grasshoppers", "mosquitoes", "migration of birds", "hibernation", "evolution", "ecosystems",
    "food chains", "pollination", "the water cycle", "climate", "air", "fire", "ice", "steam", "vaccines", "germs",
    "the immune system", "bones", "muscles", "teeth", "the eyes", "the skin", "blood", "vitamins", "nutrition",
    "medicine", "microscopes", "telescopes", "chemistry", "physics", "biology", "geology", "astronomy",
    "oceanography", "genetics", "the periodic table",
    # people, places and history (more)
    "ancient Greece", "ancient China", "the Great Wall", "the Silk Road", "the Middle Ages", "the Renaissance",
    "the Industrial Revolution", "explorers", "sailors", "inventors", "scientists", "astronauts", "farmers",
    "firefighters", "doctors", "nurses", "teachers", "chefs", "artists", "musicians", "writers", "engineers",
    "architects", "pilots", "police officers", "mail carriers", "kings and queens", "democracy", "laws", "elections",
    "newspapers", "the post office", "airports", "train stations", "harbors", "skyscrapers", "temples", "churches",
    "palaces", "parks", "zoos", "aquariums", "playgrounds", "restaurants", "bakeries", "supermarkets", "factories",
    "banks", "stadiums", "Paris", "Tokyo", "London", "New York", "Africa", "Asia", "Europe", "South America",
    "Australia", "the Sahara", "the Himalayas", "the Alps", "Iceland", "Japan", "India", "Brazil", "Egypt today",
    "Mexico", "Canada", "Norway",
    # everyday life (more)
    "pizza", "pasta", "noodles", "sandwiches", "salad", "eggs", "milk", "butter", "yogurt", "ice cream", "cookies",
    "cake", "pancakes", "bananas", "oranges", "strawberries", "grapes", "lemons", "tomatoes", "potatoes", "carrots",
    "onions", "garlic", "spices", "pepper", "olive oil", "juice", "water bottles", "kitchens", "bedrooms",
    "furniture", "chairs", "tables", "beds", "blankets", "pillows", "windows", "doors", "keys", "locks", "mirrors",
    "lamps", "stairs", "gardens", "fences", "hats", "gloves", "scarves", "jackets", "socks", "buttons", "zippers",
    "backpacks", "wallets", "glasses", "watches", "jewelry", "soap", "toothbrushes", "haircuts", "laundry",
    "cleaning", "shopping", "saving money", "budgets", "jobs", "teamwork", "leadership", "honesty", "gratitude",
    "curiosity", "creativity", "learning", "homework", "reading", "writing letters", "making friends", "sharing",
    "manners", "habits", "mornings", "evenings", "weekends", "picnics", "camping", "hiking", "fishing", "sailing",
    "skiing", "skating", "yoga", "meditation", "stress", "laughter", "dreams", "memory", "emotions",
    "birthday parties", "weddings", "grandparents", "babies", "neighbors", "volunteering",
    # technology and transport (more)
    "buses", "trucks", "motorcycles", "helicopters", "boats", "canoes", "tractors", "elevators", "escalators",
    "traffic lights", "roads", "tunnels", "canals", "dams", "radios", "televisions", "video games", "keyboards",
    "printers", "software", "programming", "algorithms", "databases", "passwords", "email", "social media",
    "search engines", "artificial intelligence", "3D printers", "drones", "microwaves", "refrigerators",
    "washing machines", "vacuum cleaners", "light bulbs", "engines", "gears", "levers", "pulleys", "springs", "wires",
    "plumbing", "GPS", "the compass", "the calendar", "the clock tower", "space stations", "nuclear power",
    "wind power", "hydropower", "steam engines",
    # arts, games and ideas (more)
    "jazz", "opera", "rock music", "folk songs", "drums", "the flute", "the trumpet", "singing", "choirs",
    "sculpture", "pottery", "knitting", "origami", "comics", "cartoons", "fairy tales", "myths", "legends", "novels",
    "libraries of the world", "museums of art", "festivals", "circuses", "magic tricks", "baseball", "golf",
    "cycling races", "marathons", "swimming races", "table tennis", "badminton", "hockey", "rugby", "cricket",
    "karate", "gymnastics", "card games", "dice", "crossword puzzles", "riddles", "jokes", "philosophy", "logic",
    "geometry", "fractions", "statistics", "probability", "economics", "geography", "freedom", "justice",
    "friendship between animals", "hope", "wisdom", "failure", "success", "change", "the future", "the past",
    "silence", "colors", "shapes", "patterns", "symmetry", "infinity",
    # held out (the last HELD_OUT_TOPICS): never trained on
    "the human heart", "the brain", "soccer balls", "lighthouses", "volleyball", "the violin", "submarines",
    "kangaroos", "umbrellas", "candles", "the desert fox", "hot air balloons",
]


TEMPLATES = ["What is {t}?", "Explain {t} to a child.", "Give three facts about {t}.",
             "Write a short poem about {t}.", "Why is {t} important?", "Describe {t} in a few sentences.",
             "Tell me a short story about {t}.", "What are the main parts of {t}?",
             "Write a paragraph about {t}.", "What can we learn from {t}?", "List some interesting things about {t}.",
             "How would you explain {t} to a friend?"]


HELD_OUT_TOPICS = 12


SPLITS = ("train", "heldout")


def prompts(split: str = "train") -> list[str]:
    """'train': the first topics; 'heldout': the last HELD_OUT_TOPICS topics; every topic × template once.

    Ordered so that any first n prompts spread over all the split's topics: prompt q·N + r is topic r
    with template (q + r) mod |TEMPLATES| (N topics), so `prompts()[:n]` is never a few topics only."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
    topics = TOPICS[:-HELD_OUT_TOPICS] if split == "train" else TOPICS[-HELD_OUT_TOPICS:]
    return [TEMPLATES[(q + r) % len(TEMPLATES)].format(t=topic)
            for q in range(len(TEMPLATES)) for r, topic in enumerate(topics)]


def template_of(prompt: str) -> str:
    """The template a prompt of either split was written from, e.g. "What is {t}?"; ValueError for a
    prompt not written here."""
    for template in TEMPLATES:
        head, tail = template.split("{t}")
        if prompt.startswith(head) and prompt.endswith(tail) and prompt[len(head):len(prompt) - len(tail)] in TOPICS:
            return template
    raise ValueError(f"{prompt!r} is none of the prompts written here (prompts.TEMPLATES × prompts.TOPICS)")


def eval_prompts(n: int = 12) -> list[str]:
    """The first n held-out prompts: by the order of `prompts`, spread over the held-out topics and the
    templates (with 12 held-out topics, the i-th is topic i mod 12 with template (i + i div 12) mod 12)."""
    return prompts("heldout")[:n]
