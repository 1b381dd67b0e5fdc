"""The small built-in English corpus that `voxmesh model init` trains its byte-level BPE on.

Written for this project (no download, no licence question). It is varied everyday English so
that common words become single tokens, and it repeats the chat-template words ("assistant",
"user", "system") often enough that each is one token, as in the released Qwen2 vocabulary:
the prompt builder relies on `<|im_start|>assistant\\n` being exactly three ids.
"""

from __future__ import annotations

_SENTENCES = """
The quick brown fox jumps over the lazy dog while the farmer watches from the gate.
She sells sea shells by the sea shore, and the shells she sells are surely sea shells.
Good morning! How are you today? I hope the weather is kind to you and your family.
Please call me back when you have a moment; there is something I would like to tell you.
The train to the city leaves at seven in the morning and arrives a little after nine.
We walked along the river until the sun went down behind the hills and the water turned gold.
Reading a good book on a rainy afternoon is one of the simple pleasures of life.
The children laughed and played in the garden while their parents talked about the news.
He opened the window, and the sound of birds filled the small and quiet room.
Music has a way of bringing people together, even when they speak different languages.
Our meeting has been moved to Thursday afternoon, so please update your calendar.
The recipe calls for two cups of flour, one cup of sugar, three eggs and a pinch of salt.
After a long day at work, there is nothing better than a warm meal and a good conversation.
The library will be closed on Monday, but you can return your books at the front desk.
Scientists have discovered a new species of frog in the forests of the mountain valley.
Thank you very much for your help; I could not have finished this project without you.
The old house at the end of the street has a red door and a garden full of roses.
If you listen carefully, you can hear the ocean from the top of the lighthouse.
My favourite season is autumn, when the leaves change colour and the air feels fresh.
The museum opens at ten o'clock and offers free tours for students every Saturday.
It's a beautiful day, isn't it? Let's go for a walk before it gets too dark.
They've been working on the new bridge for years, and it'll finally open next spring.
I'm not sure what you mean, but I'd be happy to talk about it over a cup of tea.
The weather report says it will rain tomorrow, so don't forget to bring an umbrella.
Every story has a beginning, a middle and an end, but the best ones stay with you forever.
The city council voted to build a new park near the school and the public library.
Learning to play the piano takes patience, practice and a great deal of time.
Turn left at the second traffic light, then walk straight until you see the bakery.
The doctor said that regular exercise and enough sleep are the keys to good health.
A small boat sailed slowly across the lake as the evening light began to fade.
Welcome to the show! Tonight we have a special guest who travelled a long way to be here.
The price of the ticket is twelve dollars, and children under five travel for free.
Could you please speak a little more slowly? I am still learning the language.
The company announced that it will hire more people in the coming months.
When the lights went out, everyone in the theatre held their breath and waited.
Water boils at one hundred degrees, and it freezes at zero on the Celsius scale.
The teacher asked the students to write a short essay about their summer holidays.
Remember to save your work often, because you never know when the power might fail.
The orchestra played the final movement with such energy that the audience stood up.
Hello, world. This is a test of the speech system, and it should sound clear and natural.
The assistant answered the question. The user thanked the assistant. The system was ready.
The user asked the assistant for help, and the assistant explained the answer to the user.
A system message tells the assistant how to behave; a user message asks the assistant something.
Numbers like 3, 14, 2024 and 1,000,000 are read one digit at a time by this tokenizer.
Dates such as March 5th, 1999 and times like 10:30 or 7:45 appear in everyday speech.
system
You are a helpful voice that reads text aloud.
user
Please read this sentence for me.
assistant
Of course. Here is the sentence, read slowly and clearly.
user
Thank you.
assistant
You are welcome.
"""


def corpus_lines() -> list[str]:
    """The corpus as a list of sentences, in a fixed order (training is deterministic)."""
    return [line for line in _SENTENCES.strip().splitlines() if line]
