"""Training-only phrasings of the forms the everyday list has few of: long polite requests, questions
about the user's own situation, requests naming the thing before the action, and terse notes-to-self.

Six a tool, none equal to one of toolcall.models.recipe.phrasings_everyday, written from the catalog's
names and descriptions (builder/data/tools-64.json) by a writer who had not read the hand-written test
set (models/recipe/handwritten.tsv). Same format and decontamination as the everyday phrasings:
"|"-separated, {slot} holes, dropped when near a held-out template (toolcall.models.recipe.data.near_held_out).
They join the training phrasings with ``Wording.more`` (train.py ``--more``).
"""
from __future__ import annotations

SITUATION_PHRASINGS = {
    "search_flights": "are there any planes going to {city2} around {day}|{city} to {city2}, flights?|i'm looking for airfare options to {city2}|"
    "what's the cheapest flight to {city2} in the morning|could you check which airlines fly to {city2}|flight options, leaving {day}, to {city2}",
    "book_flight": "go ahead and book the flight to {city2} for me|i'd like a seat on flight {flightno}|get {person} a ticket on the {time} plane|"
    "lock in the flight to {city2} {day}|book one seat, economy, to {city2}|reserve the {day} flight for me and {person}",
    "cancel_flight": "please cancel my plane ticket, i'd like a refund|my trip to {city2} is off, cancel the flight|cancel the flight we booked for {day}|"
    "i won't be flying to {city2} after all, cancel it|refund the ticket for flight {flightno}|flight {flightno}: cancel it",
    "check_flight_status": "what's the latest on flight {flightno}|is {person}'s flight arriving on time|when will flight {flightno} land|"
    "did flight {flightno} leave yet|arrival status for the plane from {city}|flight {flightno} status?",
    "search_hotels": "somewhere to sleep in {city} {day}?|any rooms free in {city} for {nights} nights|compare hotels in {city}|"
    "places to stay close to {place}|i need a hotel, {city}, checking in {day}|what hotels does {city} have",
    "book_hotel": "book me into a hotel in {city} for {nights} nights|i want to reserve a room, {hotel}, {day}|get us two rooms at the {hotel}|"
    "please book the room at the {hotel}|reserve a hotel room for {person} {day}|hotel booking at the {hotel} please",
    "cancel_hotel": "we're not staying at the {hotel} anymore, cancel it|please cancel the room for {day}|cancel my stay in {city}|"
    "i need to cancel a hotel reservation|cancel the room {person} booked|hotel reservation at the {hotel}: cancel",
    "search_restaurants": "where could we get {cuisine} tonight|know any nice restaurants near {place}|somewhere to eat with good reviews in {city}|"
    "looking for a {cuisine} spot nearby|what restaurants are open near {place}|good cheap food around {place}?",
    "book_restaurant_table": "can you get us a table at {restaurant} {day}|reserve seats for {party} at {restaurant}|i'd like to book a table for {party} at {time}|"
    "table at {restaurant}, {time}, {party} people|make a dinner reservation at {restaurant}|book a table for me and {person} at {time}",
    "get_weather": "what's it doing outside|is it hot in {city} right now|current conditions in {city}|"
    "how cold is it outside at the moment|is it still raining in {city}|weather right now?",
    "get_forecast": "what will the weather be like {fday} in {city}|should i expect rain {fday}|forecast for the next few days|"
    "temperature {fday} in {city}?|is {fday} going to be warm|will it be windy {fday}",
    "create_calendar_event": "put {event} in the calendar for {day}|can you schedule a meeting with {person} {day} at {time}|add an appointment: {event}, {day}|"
    "create a calendar entry for {event}|pencil in {event} for {day} at {time}|new meeting with {person} {day}",
    "update_calendar_event": "can we move {event} to {day}|reschedule {event} to {time}|change the time of my meeting with {person}|"
    "add {person} to the {event} invite|update {event} to start at {time}|{event} should be at {time} now, change it",
    "delete_calendar_event": "take the {event} out of my schedule|i don't need {event} on the calendar anymore|delete the meeting with {person} {day}|"
    "remove {event} please|wipe the {time} appointment from my calendar|{event} is off, delete it",
    "list_calendar_events": "what meetings do i have {day}|anything scheduled {range}|show my calendar {range}|"
    "what's coming up {range}|how busy am i {day}|list my appointments {day}",
    "find_meeting_time": "when can {person} and {person2} both meet|suggest a time for a meeting with {person}|find a free hour for the three of us {range}|"
    "what slot works for {person} {range}|look for a time everyone is free|when are {person} and i both available",
    "send_email": "write to {person} by email about {topic}|shoot {person} an email that {msg}|send an email to {email} about {topic}|"
    "email {person} and {person2} about {topic}|please mail {email} that {msg}|send {person} a quick email",
    "read_email": "what emails did i get {day}|read the newest message in my inbox|show me mail from {person}|"
    "open the latest email|anything from {person} in my mail|check my inbox please",
    "search_email": "look through my emails for {keyword}|find emails about {keyword} from {person}|search the inbox for {keyword}|"
    "where's the email {person} sent about {keyword}|emails mentioning {keyword}?|dig up the mail about {keyword}",
    "send_text_message": "send {person} a text saying {msg}|text {phone}: {msg}|shoot {person} a quick text|"
    "message {person} on sms that {msg}|drop {person} a text: {msg}|sms {person}",
    "make_phone_call": "give {person} a call|phone {person} please|dial {phone}|"
    "i need to call {person} now|put me through to {person}|start a call with {person}",
    "add_contact": "save {person} as a new contact|add a contact: {person}, {phone}|put {person}'s number {phone} in my contacts|"
    "new contact {person} {surname}, email {email}|store {phone} under {person}|add {person} {surname} to my address book",
    "lookup_contact": "do i have {person}'s email|search my contacts for {person}|what's the address for {person}|"
    "what's {person} {surname}'s address|get me {person}'s contact details|{person}'s phone?",
    "convert_currency": "what's {amount} {cur} worth in {cur2}|change {amount} {cur} into {cur2}|{amount} {cur} to {cur2}?|"
    "how many {cur2} do i get for {amount} {cur}|{amount} {code} in {code2} please|i have {amount} {cur}, how much is that in {cur2}",
    "get_exchange_rate": "how strong is the {code} against the {code2}|what's the rate from {cur} to {cur2}|{code}/{code2} exchange rate|"
    "today's {cur} to {cur2} rate|current rate for {code} to {code2}?|how much is one {code} in {code2} today",
    "get_stock_price": "how are {stock} shares doing|what's {ticker} trading at|{stock} share price today|"
    "is {ticker} up or down today|check the stock {ticker}|price of {stock} stock?",
    "check_account_balance": "what's left in my {account} account|how much is in {account}|show me my bank balance|"
    "what's my current balance|balance of my {account} account please|do i have enough money in {account}",
    "transfer_money": "pay {person} {amount} {cur} from my account|wire {amount} to {person}'s account|move {amount} from {account} to {account2}|"
    "pay {person} back {amount} {cur}|transfer {amount} {cur} to my {account} account|give {person} {amount} from my {account} account",
    "pay_invoice": "pay the {vendor} invoice|settle invoice {invoice} from {account}|the {vendor} bill is due, pay it|"
    "pay off invoice number {invoice}|pay bill {invoice} please|clear the {vendor} invoice",
    "list_transactions": "list every payment i made {range}|show recent payments from {account}|my last purchases|"
    "list the charges on my {account} account|payments out of {account} {range}|transaction history {range}",
    "create_reminder": "don't let me forget to {task} {day}|remind me at {time} to {task}|set a reminder for {day}: {task}|"
    "ping me {day} about {task}|remind me {day} that {msg}|reminder to {task} at {time}",
    "set_alarm": "alarm at {time} please|i have to be up by {time}, set an alarm|alarm for {time} {day}|"
    "i need to wake up at {time}|set my alarm to {time}|alarm {time} tomorrow",
    "start_timer": "start counting down {duration}|set a {duration} timer|time {duration} for the {cook}|"
    "start timing {duration}|can you run a timer for {duration}|{duration} timer please",
    "create_task": "put {task} on my to-do list|remember as a task: {task}|add a task to {task} by {day}|"
    "i need to {task}, add it to my tasks|make a task for the {project} project: {task}|to-do: {task}",
    "list_tasks": "what do i still have to do|show my to-dos for {project}|what tasks are due {day}|"
    "open items on my list|list everything on my to-do list|what's left to do {range}",
    "complete_task": "the {task} task is finished|{task} is done, mark it|tick {task} off my list|"
    "i've done the task {task}|set {task} to complete|done with {task}, cross it off",
    "create_note": "jot down: {notetext}|new note titled {title}|save a note that {notetext}|"
    "take a note: {notetext}|start a note named {title}|note to self: {notetext}",
    "search_notes": "find the note about {keyword}|which of my notes say {keyword}|look in my notes for {title}|"
    "did i write a note about {keyword}|search notes: {keyword}|open my note on {title}",
    "translate_text": "translate this into {lang}: {phrase}|put {phrase} into {lang}|say {phrase} in {lang}|"
    "translate {fphrase} for me|{phrase} in {lang} please|how would i write {phrase} in {lang}",
    "detect_language": "tell me the language of {fphrase}|what language is this: {fphrase}|identify the language of {fphrase}|"
    "what's the language here, {fphrase}|guess the language: {fphrase}|what language did they write {fphrase} in",
    "define_word": "{word} means what?|what's the definition of {word}|look up the word {word} in the dictionary|"
    "what is meant by {word}|{word} definition?|dictionary entry for {word}",
    "summarize_document": "give me a summary of {doc}|tl;dr of {file}|boil {doc} down to a few lines|"
    "summarise {file} please|what's {doc} about, in short|short summary of {file}",
    "search_web": "search the internet for {query}|look online for {query}|web search: {query}|"
    "find me results for {query}|can you google {query}|search for {query} on the web",
    "get_news": "what's in the news {range}|headlines about {topic}|news from {region}|"
    "any breaking news {range}|news headlines {region}|latest news on {topic}",
    "search_wikipedia": "open the wikipedia entry for {wiki}|check wikipedia for {wiki}|find the wikipedia page on {wiki}|"
    "what does wikipedia say about {wiki}|pull up {wiki} on wikipedia|wikipedia: {wiki}",
    "calculate": "work out {expr}|i need the answer to {expr}|what do you get for {expr}|"
    "help me calculate {expr}|could you compute {expr}|tell me what {expr} comes to",
    "convert_units": "{qty} in {tounit}|turn {qty} into {tounit}|what is {qty} expressed in {tounit}|"
    "{qty} converted to {tounit}?|what are {qty} in {tounit}|convert {qty} into {tounit} please",
    "get_time_zone": "what's the local time in {city}|current time in {city}?|time over in {city} right now|"
    "what time do they have in {city}|which time zone is {city}|clock time in {city}",
    "get_directions": "which way to {place}|how do i drive to {place}|best way to {place} by {mode}|"
    "take me to {place}, directions please|how far is {place} by {mode}|give me a route to {place} by {mode}",
    "get_traffic": "how's traffic on {road}|is there a backup on {road} now|is {road} busy right now|"
    "traffic report for {city}|are the roads clear to {place}|road conditions on {road}?",
    "book_taxi": "call me a cab to {place}|can you order me a taxi to {place}|taxi to {place} at {time}|"
    "get a car to pick me up at {time}|book a ride for {person} to {place}|send a taxi to {place}",
    "search_train_tickets": "trains from {city} to {city2} {day}|train ticket prices from {city} to {city2}|rail tickets {city} {city2}|"
    "what trains go to {city2} {day}|find the next train to {city2}|train fares to {city2}?",
    "track_package": "where's my parcel|has my package {trackno} arrived|delivery status of my {shop} order|"
    "follow my delivery {trackno}|when will my {shop} package come|tracking number {trackno}",
    "order_food_delivery": "have {dish} brought to my place|order {dish} from {restaurant} to my door|i want {dish} delivered tonight|"
    "food delivery: {dish}|order in some {dish}|deliver {dish} from {restaurant}",
    "play_music": "put on {song}|play {artist} please|i want to hear {song}|"
    "music: {genre}|play the {playlist} playlist|some {genre} music please",
    "pause_music": "pause what's playing|music on pause please|pause playback|"
    "stop the music for a moment|music off for now|pause the song please",
    "create_playlist": "make a {playlist} playlist|new playlist with {song} and {song2}|start a playlist called {playlist}|"
    "build a playlist of {genre} songs|put {song} in a new playlist|create a playlist for {activity}",
    "search_movies": "any good {genre} movies|what's showing at the cinema {day}|films starring {artist}|"
    "look up the movie {movie}|films playing tonight|when is {movie} showing near me",
    "buy_movie_tickets": "get {party} tickets to {movie}|buy seats for {movie} at {time}|i want tickets for {movie} {day}|"
    "book cinema tickets for {movie}|purchase {party} tickets for the {time} show|two tickets for {movie} please",
    "get_sports_score": "{team} final score?|final score of {team} game|did {team} win {day}|"
    "{team} result?|what's the score in the {team} match|who's winning, {team}?",
    "set_thermostat": "make it {temp} degrees in here|heat to {temp}|change the thermostat to {temp} degrees|"
    "put the heating on {temp}|warm the house to {temp}|cool it down to {temp} degrees",
    "turn_on_lights": "turn the {room} lights on|flip the {room} lights on|switch the lights on in the {room}|"
    "{room} lights on please|can you put the lights on|turn on the light in here",
    "turn_off_lights": "darken the {room}|switch off the light in the {room}|lights out in the {room}|"
    "turn the lights off please|shut off the {room} lights|no more lights in the {room}",
    "upload_file": "store {file} online and share it|share {file} with a link|upload {file} please|"
    "back up {file} to cloud storage|send {file} to my cloud drive|make a share link for {file}",
}
