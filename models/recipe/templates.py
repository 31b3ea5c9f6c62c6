"""Request templates and slot values of the tool-discovery data (models/recipe/data.py).

``TEMPLATES``: tool -> its 7 templates, "|"-separated; each template carries the words that
single its tool out (verb and object), so a phrasing held out for testing is still learnable.
``SLOTS``: slot name -> values; ``PAIRED`` slots take the value at the index drawn for their
partner (a unit conversion's target unit matches its quantity).
"""
from __future__ import annotations

TEMPLATES = {
    "search_flights": "find flights from {city} to {city2} {day}|search for flights to {city2} leaving {day}|are there "
    "any cheap flights from {city} to {city2}|show me flight options to {city2} for {day}|look up flights between "
    "{city} and {city2}|which airlines fly from {city} to {city2} {day}|i need to compare flights to {city2}",
    "book_flight": "book a flight to {city2} {day}|book me on the {time} flight to {city2}|reserve a seat on a flight "
    "from {city} to {city2}|get me a plane ticket to {city2} for {day}|please book the flight to {city2} for "
    "{person}|buy a plane ticket from {city} to {city2}|book {person} a seat on the flight to {city2}",
    "cancel_flight": "cancel my flight to {city2}|cancel my flight from {city} to {city2} {day}|please cancel "
    "{person}'s flight booking|i want to cancel my plane ticket to {city2}|cancel the flight to {city2} for a "
    "refund|cancel my flight reservation for {day}|we are not flying to {city2} anymore, cancel the flight",
    "check_flight_status": "is my flight to {city2} on time|check the status of flight {flightno}|has flight "
    "{flightno} been delayed|is the flight from {city} delayed|what is the status of my flight to {city2} {day}|is "
    "flight {flightno} delayed or on time|show the arrival status of flight {flightno} from {city}",
    "search_hotels": "find a hotel in {city} for {day}|search hotels in {city} for {nights} nights|what hotels are "
    "available in {city} {day}|show me cheap hotels near the center of {city}|look for hotels in {city} with free "
    "rooms|are there any hotels with a pool in {city}|i need somewhere to stay in {city}, show me hotels",
    "book_hotel": "book a hotel room in {city} for {day}|reserve a room at the {hotel} in {city}|book me a room at "
    "the {hotel} for {nights} nights|make a hotel reservation in {city} for {person}|book the {hotel} for {day}|get "
    "me a double room at a hotel in {city}|please reserve {nights} nights at the {hotel}",
    "cancel_hotel": "cancel my hotel reservation in {city}|cancel the room at the {hotel}|i won't need the hotel in "
    "{city} anymore, cancel it|please cancel {person}'s hotel booking for {day}|cancel my booking at the "
    "{hotel}|cancel the hotel room i reserved for {day}|cancel my stay at the {hotel} in {city}",
    "search_restaurants": "find a good {cuisine} restaurant in {city}|search for restaurants near {place}|where can "
    "i eat {cuisine} food near {place}|recommend a cheap restaurant in {city}|show me the best rated {cuisine} "
    "restaurants nearby|are there any {cuisine} restaurants around {place}|look up restaurants open late in {city}",
    "book_restaurant_table": "book a table for {party} at {restaurant} at {time}|reserve a table for {party} "
    "people {day}|get us a table at {restaurant} for {time}|make a dinner reservation for {party} at "
    "{restaurant}|book a table at a {cuisine} restaurant for {day}|reserve a table at {restaurant} {day} at "
    "{time}|can you get a table for {party} at {restaurant} tonight",
    "get_weather": "what is the weather in {city}|what's the weather like in {city} right now|is it raining in "
    "{city} at the moment|how hot is it in {city} today|tell me the current weather in {city}|check the weather "
    "in {city} now|how cold is it outside in {city} right now",
    "get_forecast": "what is the forecast for {city} {fday}|will it rain in {city} {fday}|give me the weather "
    "forecast for {city} this week|is it going to snow in {city} {fday}|show the forecast for the next {n} days in "
    "{city}|what will the weather be like in {city} {fday}|how warm will it be in {city} {fday}",
    "create_calendar_event": "add {event} to my calendar {day} at {time}|schedule {event} for {day} at "
    "{time}|create a calendar event called {event} {day}|put {event} in my calendar for {day}|set up a meeting "
    "with {person} {day} at {time}|add an event to my calendar for {event} {day}|create an event for {event} "
    "with {person} {day}",
    "update_calendar_event": "move {event} to {day} at {time}|reschedule {event} to {time}|change the time of "
    "{event} to {time}|rename {event} in my calendar to {event2}|add {person} to the {event} on my calendar|push "
    "{event} back to {day}|update the calendar event {event} to start at {time}",
    "delete_calendar_event": "delete {event} from my calendar|remove the {event} {day} from my "
    "calendar|delete the {event} {day}|clear {event} off my calendar|delete the calendar event {event}|remove "
    "{event} from my schedule|erase the {event} from my calendar {day}",
    "list_calendar_events": "what is on my calendar {day}|list my events for {day}|show my calendar for "
    "{range}|what meetings do i have {day}|do i have any events planned {day}|show me all calendar events "
    "{range}|what's on my calendar {range}",
    "find_meeting_time": "find a time when {person} and {person2} are free|when can i meet with {person} "
    "{range}|find a free slot for a meeting with {person}|suggest a meeting time for me, {person} and "
    "{person2}|when are {person} and i both free to meet {range}|find a time to meet that works for the {project} "
    "team|look for an open slot to meet {person} {range}",
    "send_email": "send an email to {person} about {topic}|email {person} that {msg}|write an email to {person} "
    "saying {msg}|send {person} a mail about {topic}|shoot {person} an email about {topic}|compose and send an "
    "email to {email}|email {person} and {person2} about {topic}",
    "read_email": "read my emails|read me the latest email from {person}|check my inbox|what new emails do i "
    "have|open my unread emails from {person}|show me the emails in my inbox|did i get any new email from "
    "{person} today",
    "search_email": "search my email for {keyword}|find the email from {person} about {keyword}|look for emails "
    "mentioning {keyword}|search my inbox for emails from {person} last week|find all emails about {keyword}|dig "
    "up the email {person} sent about {keyword}|which emails mention {keyword}",
    "send_text_message": "text {person} that {msg}|send a text message to {person} saying {msg}|send an sms to "
    "{phone}|send {person} a text that {msg}|send {person} a text about {topic}|shoot a quick text to "
    "{person}|let {person} know by text that {msg}",
    "make_phone_call": "call {person}|make a phone call to {phone}|phone {person} now|give {person} a call|dial "
    "{phone}|call {person} on the mobile|start a phone call with {person}",
    "add_contact": "add {person} to my contacts with number {phone}|save a new contact {person} {surname}|create "
    "a contact for {person} with email {email}|store {phone} as a new contact for {person}|add a new contact "
    "named {person}|save {person}'s email {email} to my contacts|put {person} {surname} in my contacts",
    "lookup_contact": "what is {person}'s phone number|look up {person}'s email address|find the contact details "
    "for {person}|show me {person}'s address|search my contacts for {person}|what's the number of {person} "
    "{surname}|get {person}'s email address from my contacts",
    "convert_currency": "convert {amount} {cur} to {cur2}|how much is {amount} {cur} in {cur2}|change {amount} "
    "{cur} into {cur2}|what do {amount} {cur} come to in {cur2}|convert {amount} {cur} into {cur2} for me|turn "
    "{amount} {cur} into {cur2}|how many {cur2} would i get for {amount} {cur}",
    "get_exchange_rate": "what is the exchange rate between {cur} and {cur2}|what's the {code} to {code2} rate "
    "today|show the current {code} {code2} exchange rate|how strong is the {code} against the {code2} "
    "today|get the exchange rate for {cur} to {cur2}|tell me today's rate from {code} to {code2}|has the {code} to "
    "{code2} exchange rate gone up",
    "get_stock_price": "what is {stock} stock trading at|get the stock price of {stock}|how is {ticker} stock "
    "doing today|show me the share price of {stock}|what's the latest stock quote for {ticker}|how much is one "
    "share of {stock}|did {stock} stock go up today",
    "check_account_balance": "what is the balance of my {account} account|how much money do i have in my "
    "{account} account|check my bank balance|show my {account} account balance|how much is left in my {account} "
    "account|tell me my current balance|what's my balance right now",
    "transfer_money": "transfer {amount} {cur} from {account} to {account2}|transfer {amount} {cur} to "
    "{person}|move {amount} {cur} into my {account} account|wire {amount} {cur} to {person}'s account|send "
    "{person} {amount} {cur} from my {account} account|make a bank transfer of {amount} {cur} to {person}|move "
    "{amount} {cur} from {account} into {account2}",
    "pay_invoice": "pay invoice {invoice}|pay the {vendor} invoice from my {account} account|settle invoice "
    "number {invoice}|pay the outstanding invoice from {vendor}|pay my {vendor} bill|pay the invoice {invoice} "
    "today|take care of the {vendor} invoice due {day}",
    "list_transactions": "show my recent transactions|list the transactions on my {account} account|what did i "
    "spend money on {range}|show all transactions from my {account} account {range}|list my card purchases "
    "{range}|what are my latest bank transactions|list what i spent from my {account} account {range}",
    "create_reminder": "remind me to {task} {day} at {time}|set a reminder to {task}|create a reminder for {day} "
    "to {task}|don't let me forget to {task} {day}|remind me at {time} to {task}|add a reminder to {task} "
    "{day}|i need a reminder to {task} {day}",
    "set_alarm": "set an alarm for {time}|wake me up at {time} {day}|set an alarm at {time} {day}|alarm at "
    "{time} please|create an alarm for {time} every weekday|i need an alarm to wake me up at {time}|set my alarm "
    "clock to {time}",
    "start_timer": "start a timer for {duration}|set a timer for {duration}|count down {duration}|start a "
    "{duration} countdown|run a timer for {duration}|set a {duration} timer for the {cook}|start a countdown "
    "timer of {duration}",
    "create_task": "add a task to {task}|create a task to {task}|put {task} on my to-do list for {day}|new task: "
    "{task}|add a task to {task} due {day}|make a to-do item to {task}|add a task for the {project} project to "
    "{task}",
    "list_tasks": "what is on my to-do list|list my open tasks|show my tasks due {day}|what tasks are left for "
    "the {project} project|which tasks do i still have|show me everything on my to-do list|what tasks do i still "
    "need to do {range}",
    "complete_task": "mark the task {task} as done|mark {task} as done on my to-do list|complete the task "
    "{task}|cross {task} off my to-do list|the task to {task} is done|set the task {task} to completed|mark my "
    "task to {task} as completed",
    "create_note": "take a note: {notetext}|write a note saying {notetext}|create a note called {title}|jot down "
    "a note that {notetext}|make a new note titled {title} with {notetext}|save a note that {notetext}|note down "
    "that {notetext}",
    "search_notes": "search my notes for {keyword}|find the note about {title}|look through my notes for "
    "{keyword}|which of my notes mention {keyword}|open the note i wrote about {title}|find notes containing "
    "{keyword}|do i have a note about {keyword}",
    "translate_text": "translate {phrase} into {lang}|how do you say {phrase} in {lang}|what is {phrase} in "
    "{lang}|translate this to {lang}: {phrase}|say {phrase} in {lang}|give me the {lang} translation of "
    "{phrase}|translate {phrase} to {lang} for me",
    "detect_language": "what language is {fphrase} written in|detect the language of {fphrase}|which language "
    "is this: {fphrase}|identify the language of this text: {fphrase}|what language does {fphrase} come "
    "from|tell me what language {fphrase} is|figure out which language {fphrase} is in",
    "define_word": "define {word}|what does {word} mean|give me the definition of {word}|look up {word} in the "
    "dictionary|what is the meaning of the word {word}|define the word {word} for me|dictionary definition of "
    "{word} please",
    "summarize_document": "summarize {doc}|give me a summary of {doc}|sum up {doc} in a few lines|write a short "
    "summary of {doc}|summarize the key points of {doc}|condense {doc} into a short summary|give me the gist of "
    "{doc} in a summary",
    "search_web": "search the web for {query}|google {query}|look up {query} online|find websites about "
    "{query}|do a web search on {query}|search online for {query}|search the internet for {query}",
    "get_news": "what's the latest news on {topic}|show me today's news headlines|any news about {topic}|give me "
    "the news from {city}|read me the top headlines about {topic}|what are the news headlines today|get the "
    "latest news in {region}",
    "search_wikipedia": "look up {wiki} on wikipedia|what does wikipedia say about {wiki}|search wikipedia for "
    "{wiki}|find the wikipedia article on {wiki}|open the wikipedia page for {wiki}|check wikipedia for "
    "{wiki}|pull up the wikipedia entry about {wiki}",
    "calculate": "calculate {expr}|what is {expr}|compute {expr}|how much is {expr}|work out {expr}|do the "
    "math: {expr}|calculate {expr} for me",
    "convert_units": "convert {qty} to {tounit}|how many {tounit} is {qty}|what is {qty} in {tounit}|change {qty} "
    "into {tounit}|convert {qty} into {tounit} please|express {qty} in {tounit}|how much is {qty} in {tounit}",
    "get_time_zone": "what time is it in {city}|what time zone is {city} in|what's the local time in {city}|how "
    "many hours ahead is {city}|tell me the current time in {city}|which time zone does {city} use|what is the "
    "local time in {city} now",
    "get_directions": "how do i get to {place} from {place2}|directions to {place}|give me directions from "
    "{place} to {place2}|what's the fastest route to {place}|how long does it take to walk to {place}|show me the "
    "route to {place} by {mode}|get directions to {place} by {mode}",
    "get_traffic": "how is the traffic on {road}|is there traffic on the way to {place}|check traffic in "
    "{city}|are there any traffic jams on {road}|how bad is the traffic downtown right now|is there heavy traffic "
    "on {road}|show current traffic conditions near {place}",
    "book_taxi": "book a taxi to {place}|get me a cab to {place}|order a taxi for {time}|book me a cab to "
    "{place}|i need a taxi from {place} to {place2}|send a taxi to pick me up at {place}|arrange a taxi to {place} "
    "at {time}",
    "search_train_tickets": "find trains from {city} to {city2} {day}|search train tickets to {city2}|when is "
    "the next train to {city2}|how much is a train ticket from {city} to {city2}|show train connections between "
    "{city} and {city2}|look up train times from {city} to {city2}|are there any trains to {city2} {day}",
    "track_package": "track my package|where is my package {trackno}|track the parcel with number "
    "{trackno}|when will my package arrive|what's the delivery status of package {trackno}|has my package from "
    "{shop} shipped yet|track the package from {shop}",
    "order_food_delivery": "order {dish} for delivery|get {dish} delivered from {restaurant}|i want to order "
    "{dish} from {restaurant} for delivery|have some {cuisine} food delivered at {time}|order delivery from "
    "{restaurant}|can you order me {dish} for delivery to my home|order {dish} delivered to the office by {time}",
    "play_music": "play {song}|put on some {genre} music|play some music by {artist}|start playing my "
    "{playlist} playlist|i want to listen to {artist}|play the song {song}|play songs by {artist}",
    "pause_music": "pause the music|pause the music for a moment|pause playback|pause this song|pause the song "
    "for a second|stop the music for now|pause what's playing",
    "create_playlist": "create a playlist called {playlist}|make a new playlist with {song} and {song2}|start a "
    "{genre} playlist named {playlist}|put together a playlist of {artist} songs|make me a {playlist} "
    "playlist|create a new playlist for {activity}|create a playlist of {genre} songs",
    "search_movies": "find {genre} movies playing nearby|what movies are showing {day}|search for the movie "
    "{movie}|when is {movie} playing in {city}|show me showtimes for {movie}|what movies are on at the cinema "
    "{day}|find a good {genre} movie to watch",
    "buy_movie_tickets": "buy {n} tickets for {movie}|get me movie tickets to see {movie} {day}|buy {n} movie "
    "tickets for {movie} at {time}|purchase movie tickets for {movie}|buy a ticket for the {time} showing of "
    "{movie}|grab {n} cinema tickets for {movie}|i want to buy tickets for {movie} {day}",
    "get_sports_score": "what was the score of the {team} game|did {team} win last night|who won the {team} "
    "match|give me the latest {sport} scores|what's the score between {team} and {team2}|what was the final "
    "score of {team} yesterday|show the score of the {team} vs {team2} match",
    "set_thermostat": "set the thermostat to {temp} degrees|make it {temp} degrees in the house|turn the heat up "
    "to {temp} degrees|change the thermostat at home to {temp} degrees|set the heating to {temp} degrees|cool "
    "the house down to {temp} degrees|adjust the thermostat to {temp}",
    "turn_on_lights": "turn on the lights in the {room}|switch on the {room} lights|lights on in the "
    "{room}|turn the {room} light on|can you turn the lights on in the {room}|put the lights on in the "
    "{room}|switch the lights on",
    "turn_off_lights": "turn off the lights in the {room}|switch off the {room} lights|lights off in the "
    "{room}|turn the {room} light off|turn all the lights off in the {room}|please switch off every light in the "
    "{room}|switch the lights off",
    "upload_file": "upload {file} to the cloud|upload {file} and give me a share link|put {file} on my cloud "
    "drive|back up {file} to cloud storage|save {file} to my cloud storage|share {file} with a cloud link|store "
    "{file} in the cloud",
}

# Slot values, shared by all splits (only templates are split). "{x2}" draws from x's list, != x.
SLOTS = {
    "city": "Paris London Tokyo Berlin Madrid Rome Lisbon Oslo Cairo Lima Sydney Toronto Chicago Boston Seattle "
            "Denver Austin Dublin Vienna Prague Warsaw Athens Istanbul Mumbai Delhi Seoul Singapore Dubai "
            "Nairobi Zurich Geneva Amsterdam Brussels".split(),
    "person": "Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Oscar Peggy Victor Wendy Maria Tom".split(),
    "surname": "Smith Garcia Muller Rossi Tanaka Kim Novak Silva Dubois Jensen".split(),
    "day": ["today", "tomorrow", "tonight", "monday", "friday", "next tuesday", "this weekend", "March 3",
            "June 12", "next week", "saturday morning", "sunday"],
    "fday": ["tomorrow", "this weekend", "on friday", "next week", "on monday", "over the next three days"],
    "range": ["this week", "next week", "tomorrow", "this month", "last week", "today", "over the weekend"],
    "time": ["7am", "8:30", "noon", "6 pm", "9:15 am", "half past five", "10pm", "3 in the afternoon"],
    "n": "2 3 4 5 6".split(), "nights": "two three four five seven".split(),
    "party": ["two", "four", "six", "8 people", "three"],
    "flightno": "LH 404|BA 117|AF 1280|UA 92|KL 643|DL 15".split("|"),
    "hotel": ["Grand Hotel", "Hilton", "Park Hotel", "Ritz", "Hotel Central", "Marriott"],
    "cuisine": "Italian Thai Mexican Indian Japanese vegan Greek Chinese".split(),
    "restaurant": ["Luigi's", "the Golden Dragon", "Sakura", "Casa Pepe", "the Green Fork", "Bistro 21"],
    "place": ["the airport", "the train station", "the office", "Central Park", "the museum", "the city center",
              "the mall", "the stadium", "the university", "the harbor"],
    "event": ["the team standup", "the dentist appointment", "lunch with Maria", "the project review",
              "the budget meeting", "yoga class", "the quarterly planning", "the interview"],
    "project": ["website", "marketing", "Q3 planning", "mobile app", "onboarding"],
    "topic": ["the budget", "the trip", "the new project", "the quarterly report", "the offsite",
              "climate change", "the elections", "artificial intelligence", "football"],
    "msg": ["I am running late", "dinner is at 8", "the meeting moved to noon", "I landed safely",
            "the report is ready", "I will be home soon"],
    "email": ["sales@acme.com", "maria.silva@example.org", "hr@company.com", "tom@mail.net"],
    "phone": ["555 0142", "+44 20 7946 0018", "555 867 5309", "0176 2231 448"],
    "keyword": ["invoice", "vacation", "the contract", "the offsite", "passwords", "the launch", "recipes"],
    "amount": "20 50 100 250 1200 75 3000 15".split(),
    "cur": "euros dollars yen pounds francs pesos rupees".split(),
    "code": "EUR USD JPY GBP CHF CAD AUD".split(),
    "stock": "Apple Tesla Nvidia Microsoft Amazon Google Netflix".split(),
    "ticker": "AAPL TSLA NVDA MSFT AMZN GOOG".split(),
    "account": "checking savings business joint".split(),
    "invoice": "4821 INV-1093 7755 A-310".split(),
    "vendor": ["electricity", "internet", "water", "Acme", "phone", "gym"],
    "task": ["buy milk", "water the plants", "renew my passport", "finish the slides", "clean the garage",
             "walk the dog", "pick up the dry cleaning", "fix the bike", "return the library books"],
    "duration": ["10 minutes", "25 minutes", "an hour", "90 seconds", "five minutes", "half an hour"],
    "cook": ["pasta", "eggs", "pizza", "tea", "laundry"],
    "notetext": ["the wifi password is on the fridge", "ideas for the garden", "buy a gift for Maria",
                 "the parking spot is level 3", "book recommendations from Tom"],
    "title": ["grocery list", "meeting ideas", "packing list", "gift ideas", "the garden plan"],
    "phrase": ["'good morning'", "'where is the station'", "'thank you very much'", "'how much does it cost'",
               "'see you tomorrow'"],
    "fphrase": ["'bonjour tout le monde'", "'wie geht es dir'", "'muito obrigado'", "'gracias amigo'",
                "'arigato gozaimasu'", "'dziekuje bardzo'"],
    "lang": "French Spanish German Japanese Italian Portuguese Korean Dutch".split(),
    "word": "serendipity ephemeral ubiquitous gregarious laconic quixotic ineffable".split(),
    "doc": ["the quarterly report", "this contract", "the project proposal", "the meeting notes",
            "report.pdf", "this article"],
    "file": "budget.xlsx photos.zip report.pdf notes.txt slides.pptx contract.docx".split(),
    "query": ["best hiking boots", "how to fix a flat tire", "cheap laptops", "python tutorials",
              "vegan recipes", "used cars"],
    "region": ["Europe", "Asia", "South America", "Africa", "the US"],
    "wiki": ["the Roman Empire", "photosynthesis", "Marie Curie", "black holes", "the Eiffel Tower"],
    "expr": ["37 times 12", "15 percent of 240", "1200 divided by 7", "the square root of 144",
             "2 to the power of 10", "345 plus 789", "(12 + 8) * 3"],
    "qty": ["5 miles", "70 kilograms", "3 liters", "100 fahrenheit", "12 inches", "2 gallons", "500 grams"],
    "tounit": ["kilometers", "pounds", "cups", "celsius", "centimeters", "liters", "ounces"],
    "road": ["the I-95", "the highway", "the ring road", "Main Street", "the bridge", "the A1"],
    "mode": ["car", "bus", "bike", "train", "foot"],
    "trackno": ["1Z999AA101", "JD0146 0012", "RR123456789", "9400 1000 5"],
    "shop": ["Amazon", "IKEA", "eBay", "Zalando"],
    "dish": ["pizza", "pad thai", "a burger", "sushi", "curry", "tacos"],
    "song": ["Bohemian Rhapsody", "Hey Jude", "Yesterday", "Hotel California", "Imagine"],
    "artist": ["Taylor Swift", "the Beatles", "Miles Davis", "Adele", "Queen"],
    "genre": "jazz rock classical pop comedy horror".split(),
    "playlist": ["road trip", "workout", "chill evening", "party", "study"],
    "activity": ["running", "the gym", "a long drive", "studying"],
    "movie": ["Dune", "Inception", "Oppenheimer", "Barbie", "Interstellar"],
    "team": ["Real Madrid", "the Lakers", "Arsenal", "the Yankees", "Barcelona", "the Celtics"],
    "sport": "football basketball tennis baseball".split(),
    "temp": "18 19 20 21 22 23 24".split(),
    "room": ["kitchen", "living room", "bedroom", "office", "garage", "bathroom"],
}
PAIRED = {"tounit": "qty"}  # slot -> the slot whose drawn index it reuses
