"""Training-only everyday phrasings: how people actually type a request for each tool.

Terse fragments ("weather {city}"), questions, commands, polite and casual forms and everyday
synonyms (ring / phone, cab / ride, txt / message), 12 a tool, "|"-separated with {slot}
holes like toolcall.models.recipe.templates. Written from the catalog's names and
descriptions, after the hand-written evaluation set (models/recipe/handwritten.tsv) was
committed and by the same writer: never copied from it, but not independent of it either.
With ``Wording.phrasings`` (the default) they join a tool's training templates, like
toolcall.models.recipe.paraphrases, minus any near its held-out templates
(toolcall.models.recipe.data.near_held_out).
"""
from __future__ import annotations

EVERYDAY_PHRASINGS = {
    "search_flights": "flights to {city2}|any flights {city} to {city2} {day}?|cheapest way to fly to {city2}|"
    "flight search {city} {city2}|what flights are there to {city2} {day}|can i fly to {city2} {day}|"
    "show flights out of {city}|look for a plane to {city2}|i wanna fly to {city2}, what's available|"
    "need a flight from {city} {day}|direct flights to {city2}?|check airfare to {city2}",
    "book_flight": "book it, the {time} flight to {city2}|get me on a plane to {city2} {day}|book {person} on a "
    "flight to {city2}|i'll take the flight to {city2}, book it|reserve a flight for {person} {day}|"
    "buy a flight ticket to {city2}|book a one way ticket to {city2}|put me on the {day} flight|"
    "please book my flight home|secure a seat to {city2}|plane ticket to {city2} please, book it|book flight {flightno}",
    "cancel_flight": "cancel flight {flightno}|i can't make my flight {day}, cancel it|cancel the plane ticket|"
    "get rid of my flight booking to {city2}|cancel {person}'s flight and refund it|refund my flight|"
    "drop my flight to {city2}|scratch the {day} flight|i want to cancel my trip by plane to {city2}|"
    "flight cancellation please|undo the flight booking|cancel our flights",
    "check_flight_status": "is {flightno} on time?|status of my flight|flight {flightno} delayed?|did my flight "
    "take off|when does my flight land|has {flightno} landed yet|is the {time} flight delayed|any delay on flight "
    "{flightno}|is my plane late|departure time of {flightno}|what gate and time for flight {flightno}|track flight {flightno}",
    "search_hotels": "hotels {city}|any hotels in {city} {day}?|where can i stay in {city}|find accommodation in "
    "{city}|hotel options near {place}|cheap places to stay in {city}|look for a hotel for {nights} nights|"
    "hotel in {city} under 100 a night|what's available to stay in {city}|show hotels near {place}|"
    "i need a room somewhere in {city}|search for a hotel",
    "book_hotel": "book the {hotel}|book me a room in {city} for {nights} nights|get a hotel room for {person}|"
    "reserve the {hotel} {day}|book a single room at the {hotel}|book hotel for {day}|grab a room at the {hotel}|"
    "i'll take a room at the {hotel}, book it|book accommodation in {city}|make a booking at the {hotel}|"
    "reserve a suite at the {hotel}|book us into the {hotel} for {nights} nights",
    "cancel_hotel": "cancel the hotel booking|cancel my room at the {hotel}|i don't need the hotel anymore|"
    "cancel hotel reservation {day}|drop the hotel in {city}|undo my hotel booking|cancel {person}'s room|"
    "scrap the hotel stay|please cancel my accommodation|call off the hotel for {day}|no more hotel, cancel it|"
    "cancel the {hotel}",
    "search_restaurants": "restaurants near {place}|{cuisine} food around here?|where to eat in {city}|good "
    "{cuisine} places nearby|best restaurant near me|any {cuisine} restaurants open now|find somewhere for dinner|"
    "top rated places to eat in {city}|i'm craving {cuisine}, where can i go|cheap eats near {place}|"
    "{cuisine} restaurant recommendations|find a place for lunch in {city}",
    "book_restaurant_table": "table for {party} at {time}|book {restaurant} for {party}|reserve a table tonight|"
    "book dinner at {restaurant} {day}|get a table for {party} people at {time}|reserve lunch at {restaurant}|"
    "book us a table at {restaurant}|dinner reservation for {party} {day} at {time}|can i get a table at "
    "{restaurant}|restaurant booking for {party}|reserve {restaurant} at {time}|book a table somewhere {day}",
    "get_weather": "weather {city}|weather in {city}?|how's the weather|is it cold in {city}|is it raining "
    "now|temperature in {city}|do i need an umbrella right now|what's it like outside in {city}|current "
    "temp|is it windy in {city} today|is it sunny out|how warm is it right now in {city}",
    "get_forecast": "forecast {city}|forecast for {fday}|will it snow {fday}|is it gonna rain {fday}|weather "
    "{fday} in {city}|what's the weather going to be {fday}|weekend forecast for {city}|will it be sunny "
    "{fday}|5 day forecast {city}|do i need an umbrella {fday}|how cold will it get {fday}|rain later this week?",
    "create_calendar_event": "add {event} on {day}|put a meeting on my calendar {day} at {time}|schedule "
    "{event} {day}|new event {event} at {time}|calendar: {event} {day} {time}|book {event} in my calendar|"
    "add lunch with {person} to the calendar|make an appointment for {day} at {time}|block {time} {day} for "
    "{event}|create a meeting with {person} and {person2}|set up {event} for {day}|save {event} to my calendar",
    "update_calendar_event": "move {event} to {time}|change {event} to {day}|shift {event} by an hour|postpone "
    "{event} to {day}|push the meeting to {time}|invite {person} to {event}|rename the event {event}|change the "
    "title of {event}|move my meeting with {person} to {day}|make {event} start at {time}|change the attendees "
    "of {event}|bring {event} forward to {time}",
    "delete_calendar_event": "delete {event}|remove {event} from the calendar|cancel {event} on my calendar|"
    "take {event} off my calendar|drop {event} {day} from my schedule|get rid of the meeting {day}|delete my "
    "{time} meeting|remove the appointment on {day}|clear my {day} event|erase {event}|delete that calendar "
    "entry|remove the meeting with {person}",
    "list_calendar_events": "what's on {day}|my schedule {day}|am i free {day}|any meetings {day}?|what do i "
    "have going on {range}|agenda for {day}|calendar for {range}|show my appointments|what's my day look "
    "like|list events {range}|do i have anything {day} at {time}|my meetings {range}",
    "find_meeting_time": "when is {person} free|find time with {person} {range}|when can we all meet|pick a time "
    "for me and {person}|find a slot for {person} and {person2}|best time to meet {person} {range}|when are we "
    "all available|find a common free slot|is there a time {person} and i are both free|schedule finder for "
    "{person}|what time works for everyone|find an hour when the team is free",
    "send_email": "email {person}|email {person} about {topic}|send a mail to {email}|mail {person} that {msg}|"
    "write an email to {email}|drop {person} an email|email the team about {topic}|send {person} an email "
    "saying {msg}|compose an email about {topic}|reply to {person} by email|email {email} that {msg}|"
    "send an email",
    "read_email": "read my mail|any new emails?|what's in my inbox|open my email|read the email from "
    "{person}|check email|new mail from {person}?|show unread messages in my inbox|did {person} email me|"
    "read me my latest emails|inbox please|go through my emails",
    "search_email": "find emails about {keyword}|search inbox {keyword}|look for the email about {keyword}|"
    "find {person}'s email about {keyword}|emails mentioning {keyword}|where's that email about {keyword}|"
    "search my mail for {keyword} from {person}|find mails from {person} last month|dig out the {keyword} "
    "email|search emails for {keyword}|any email with {keyword} in it|find the message {person} mailed about {keyword}",
    "send_text_message": "text {person}|txt {person} {msg}|message {person} that {msg}|send an sms to "
    "{person}|text {phone} that {msg}|tell {person} by text that {msg}|sms {person}: {msg}|send a text "
    "to {person}|shoot {person} a message saying {msg}|text {person} and say {msg}|send a message to "
    "{phone}|drop {person} a text",
    "make_phone_call": "call {person}|ring {person}|phone {person}|call {phone}|dial {person}|give {person} a "
    "ring|call {person} please|can you call {person}|get {person} on the phone|ring {phone}|i want to call "
    "{person}|place a call to {person}",
    "add_contact": "add {person} to contacts|save {person}'s number {phone}|new contact: {person} {phone}|"
    "add a contact {person} {surname}|save this number {phone} as {person}|store {person}'s email "
    "{email}|create contact {person}|add {email} to my contacts|put {person} in my address book|save "
    "{person} {surname} as a contact|add {person}'s phone number|save contact {person}",
    "lookup_contact": "{person}'s number?|what's {person}'s email|find {person} in my contacts|get me "
    "{person}'s phone number|do i have {person}'s address|contact info for {person}|look up {person} "
    "{surname}|what is the email of {person}|{person}'s phone|where does {person} live|search contacts "
    "for {person}|find the number for {person}",
    "convert_currency": "{amount} {cur} to {cur2}|convert {amount} {cur} to {cur2}|how much is {amount} {cur} "
    "in {cur2}?|{amount} {cur} in {cur2}|what's {amount} {cur} in {cur2}|change {amount} {cur} to {cur2}|"
    "exchange {amount} {cur} for {cur2}|how many {cur2} for {amount} {cur}|convert {amount} {code} to {code2}|"
    "{amount} {code} in {code2}?|what are {amount} {cur} worth in {cur2}|convert my {amount} {cur} into {cur2}",
    "get_exchange_rate": "{code} to {code2} rate|exchange rate {code} {code2}|what's the {cur} to {cur2} "
    "rate|current rate for {cur}|how much is one {code} in {code2}|{code}/{code2}?|is the {cur} up against the "
    "{cur2}|today's exchange rate for {cur}|rate of {cur} vs {cur2}|show the {code} exchange rate|what's "
    "the conversion rate from {cur} to {cur2}|forex rate {code} {code2}",
    "get_stock_price": "{ticker} price|how's {stock} stock|{stock} share price|what's {ticker} at|stock price "
    "for {stock}|is {stock} up today|quote for {ticker}|how much is {stock} trading for|{stock} stock today?|"
    "check {ticker}|how did {stock} shares do today|price of {ticker} stock",
    "check_account_balance": "balance|my balance?|how much money do i have|what's in my {account} account|"
    "{account} balance|check balance on {account}|how much is in the bank|am i overdrawn|what's my account "
    "balance|show me my balance|how much cash is in my {account}|bank balance please",
    "transfer_money": "send {amount} {cur} to {person}|pay {person} {amount} {cur}|transfer {amount} to "
    "{person}|move {amount} {cur} to savings|wire {person} {amount} {cur}|send money to {person}|transfer "
    "from {account} to {account2}|give {person} {amount} {cur} from my account|transfer {amount} {cur} to "
    "{account2}|pay back {person} {amount} {cur}|move money to my {account} account|bank transfer to {person}",
    "pay_invoice": "pay the {vendor} bill|pay invoice {invoice}|pay my bill from {vendor}|settle the "
    "{vendor} invoice|pay {invoice}|pay the bill due {day}|take care of invoice {invoice}|pay the {vendor} "
    "invoice now|pay this invoice|clear the {vendor} bill|pay the outstanding bill|pay {vendor}",
    "list_transactions": "recent transactions|what did i spend {range}|my purchases {range}|show "
    "spending on {account}|transactions {range}|list payments from my {account} account|what went out of my "
    "account {range}|card transactions|where did my money go {range}|last 10 transactions|show my statement|"
    "what did i buy {range}",
    "create_reminder": "remind me to {task}|remind me {day} to {task}|reminder: {task} at {time}|remind me at "
    "{time}|set a reminder for {time}|don't let me forget {task}|remember to {task} {day}|reminder to "
    "{task}|ping me at {time} to {task}|remind me in an hour to {task}|nudge me {day} about {task}|"
    "make a reminder: {task}",
    "set_alarm": "alarm {time}|wake me at {time}|set alarm for {time} {day}|alarm for {time} please|wake me "
    "up {day} at {time}|i need to be up at {time}|set a wake up alarm|alarm at {time} every day|set my "
    "alarm|get me up at {time}|new alarm {time}|alarm clock {time}",
    "start_timer": "timer {duration}|{duration} timer|set timer {duration}|start a timer|countdown "
    "{duration}|time {duration} for me|timer for the {cook}|start {duration} countdown|set a timer for "
    "{duration} please|{duration} on the clock|begin a {duration} timer|timer of {duration} for the {cook}",
    "create_task": "add to my todo: {task}|todo {task}|new task {task}|add {task} to my tasks|task: {task} "
    "by {day}|put {task} on the list|create a to do: {task}|add a todo to {task}|make a task {task} due "
    "{day}|remember to {task}, add it to my tasks|add task for {project}: {task}|new to-do: {task}",
    "list_tasks": "my tasks|todo list?|what's on my list|open tasks|tasks for {day}|what do i still need to "
    "do|show the {project} tasks|what's left to do|list to-dos|pending tasks|my to do list please|anything "
    "left on my todo",
    "complete_task": "done with {task}|{task} is done|mark {task} complete|check off {task}|i finished "
    "{task}|tick off {task}|mark that task as done|task done: {task}|complete {task}|{task} done, mark it|"
    "close the task {task}|cross off {task}",
    "create_note": "note: {notetext}|note that {notetext}|make a note {notetext}|new note {title}|write this "
    "down: {notetext}|save a note: {notetext}|jot this down: {notetext}|create a note titled {title}|add a note "
    "about {title}|take a quick note {notetext}|remember this as a note: {notetext}|write a note called {title}",
    "search_notes": "find my note about {keyword}|search notes {keyword}|where's my note on {title}|notes "
    "about {keyword}?|open my {title} note|did i write down {keyword}|look in my notes for {keyword}|find the "
    "{title} note|what did i note about {keyword}|search my notes|show notes with {keyword}|any notes on {keyword}",
    "translate_text": "translate {phrase} to {lang}|{phrase} in {lang}?|how to say {phrase} in {lang}|"
    "{lang} for {phrase}|translate into {lang}: {phrase}|what's {phrase} in {lang}|translate this into "
    "{lang}|can you translate {phrase}|say {phrase} in {lang} please|{lang} translation of {phrase}|"
    "how would i say {phrase} in {lang}|translate {phrase}",
    "detect_language": "what language is {fphrase}|which language is {fphrase}|detect language: "
    "{fphrase}|what language is this|{fphrase} - what language?|identify this language: {fphrase}|is "
    "{fphrase} spanish or portuguese|language of {fphrase}?|what lang is {fphrase}|guess the language "
    "{fphrase}|which language does this come from: {fphrase}|recognize the language of {fphrase}",
    "define_word": "define {word}|meaning of {word}|what's {word} mean|what does the word {word} mean|"
    "{word} definition|definition of {word}?|what is a {word}|explain the word {word}|dictionary: "
    "{word}|whats the meaning of {word}|look up the word {word}|{word} meaning",
    "summarize_document": "summarize {doc}|summary of {file}|tl;dr {doc}|sum up {file}|give me the short "
    "version of {doc}|summarize this page|main points of {file}|summarise {doc}|what's {file} about, in "
    "short|quick summary of {doc}|condense {file}|short summary of this article",
    "search_web": "search {query}|google {query}|look up {query} on the internet|web search {query}|search "
    "online: {query}|find me {query} online|search for {query}|browse the web for {query}|what does the "
    "internet say about {query}|find websites on {query}|internet search for {query}|bing {query}",
    "get_news": "news|latest news|news about {topic}|headlines|what's happening in {region}|top stories "
    "today|any news on {topic}?|news from {city}|today's headlines|what's in the news|breaking news|"
    "latest {topic} news",
    "search_wikipedia": "wikipedia {wiki}|wiki {wiki}|look up {wiki} on wiki|wikipedia article about "
    "{wiki}|what's the wikipedia page on {wiki}|search wiki for {wiki}|{wiki} wikipedia|find {wiki} on "
    "wikipedia|open wikipedia on {wiki}|wikipedia entry for {wiki}|read the wiki on {wiki}|check wiki about {wiki}",
    "calculate": "{expr}|what's {expr}|{expr}?|calc {expr}|what is {expr}?|solve {expr}|{expr} = ?|"
    "quick math: {expr}|figure out {expr}|can you compute {expr}|whats {expr}|how much is {expr}?",
    "convert_units": "{qty} to {tounit}|{qty} in {tounit}?|how many {tounit} in {qty}|convert {qty} to "
    "{tounit}|{qty} is how many {tounit}|what's {qty} in {tounit}|change {qty} to {tounit}|{qty} into "
    "{tounit} please|how much is {qty} in {tounit}|unit conversion {qty} to {tounit}|convert {qty}|"
    "{qty} equals how many {tounit}",
    "get_time_zone": "time in {city}|what time is it in {city}?|{city} time|local time {city}|what timezone is "
    "{city}|time zone of {city}|is it night in {city} now|current time in {city}|how late is it in {city}|"
    "what's the time difference with {city}|{city} time zone?|clock in {city}",
    "get_directions": "directions to {place}|how do i get to {place}|route to {place}|way to {place} by "
    "{mode}|navigate to {place}|take me to {place}|how far is {place}|best way to {place} from {place2}|"
    "directions from {place} to {place2} by {mode}|how long to {place} by {mode}|how to get from {place} to "
    "{place2}|show me the way to {place}",
    "get_traffic": "traffic on {road}|traffic near {place}?|how's traffic|any jams on {road}|is {road} "
    "busy|traffic update for {city}|is there a traffic jam on {road}|road conditions to {place}|traffic "
    "report|is the traffic bad right now|congestion on {road}?|how's the drive to {place} looking",
    "book_taxi": "taxi to {place}|cab to {place}|get me a taxi|call a cab|book a ride to {place}|uber to "
    "{place}|order a cab for {time}|i need a ride to {place}|get a taxi to {place} at {time}|send a car to "
    "{place}|book a taxi from {place} to {place2}|lyft to {place}",
    "search_train_tickets": "trains to {city2}|train {city} to {city2} {day}|next train to {city2}?|train "
    "times {city} {city2}|rail tickets to {city2}|how much is the train to {city2}|trains from {city} "
    "{day}|find a train connection to {city2}|when does the train to {city2} leave|train fares to "
    "{city2}|search trains {city} {city2}|is there a train to {city2} {day}",
    "track_package": "where's my package|track {trackno}|track parcel {trackno}|where is my order from "
    "{shop}|delivery status {trackno}|has my parcel shipped|package tracking {trackno}|when does my "
    "{shop} order arrive|where is my delivery|track my shipment|is my package here yet|status of order {trackno}",
    "order_food_delivery": "order {dish}|get {dish} delivered|order food from {restaurant}|i want {dish} "
    "delivered|deliver {dish} to my place|order some {cuisine} food|food delivery from {restaurant}|"
    "order dinner for delivery|get me {dish} from {restaurant}|order takeout|delivery of {dish} please|"
    "order {dish} to the office",
    "play_music": "play {song}|play {artist}|put on {artist}|play some {genre}|music please|play my "
    "{playlist} playlist|play something by {artist}|i wanna hear {song}|play the album by {artist}|"
    "start some music|put on some {genre} music|play {song} by {artist}",
    "pause_music": "pause|pause music|stop the music|pause the song|hold the music|pause playback "
    "please|stop playing|mute the music for a bit|pause it|pause the track|stop the song|hit pause",
    "create_playlist": "new playlist {playlist}|make a playlist|create a {genre} playlist|playlist of {artist} "
    "songs|make a playlist for {activity}|start a new playlist called {playlist}|create playlist with "
    "{song}|build a playlist of {genre} music|make a {activity} playlist|put {song} and {song2} in a new "
    "playlist|playlist named {playlist}|create a playlist",
    "search_movies": "movies tonight|what's playing at the cinema|{genre} movies near me|showtimes for "
    "{movie}|when is {movie} showing|find a {genre} film|what films are on {day}|movie times {day}|is "
    "{movie} playing nearby|cinema listings for {city}|find movies with {artist}|what's on at the movies",
    "buy_movie_tickets": "{n} tickets for {movie}|buy tickets for {movie}|get me a ticket for {movie} {day}|"
    "book {n} seats for {movie}|tickets to {movie} at {time}|buy cinema tickets|purchase {n} tickets for the "
    "{time} show|get tickets for {movie} tonight|book movie tickets for {movie}|i want {n} tickets to "
    "{movie}|reserve seats for {movie} {day}|buy a movie ticket",
    "get_sports_score": "{team} score|did {team} win|who won {team} vs {team2}|score of the {team} game|"
    "{sport} scores|how did {team} do|final score {team} {team2}|result of the {team} match|what's the "
    "score in the {team} game|{team} result|latest {sport} results|did {team} lose",
    "set_thermostat": "thermostat {temp}|set heat to {temp}|set the temperature to {temp}|make it {temp} "
    "degrees|turn the heating up to {temp}|thermostat to {temp} please|lower the thermostat to {temp}|"
    "heat the house to {temp}|set temp to {temp} degrees|warm the house up to {temp}|turn the ac to "
    "{temp}|change thermostat to {temp}",
    "turn_on_lights": "lights on|turn on the {room} light|{room} lights on|switch on the lights|turn the "
    "lights on in here|light up the {room}|lamp on in the {room}|turn on the lamp|put the {room} lights "
    "on|lights on in the {room} please|switch the {room} light on|turn on all lights",
    "turn_off_lights": "lights off|turn off the {room} light|{room} lights off|switch off the lights|turn the "
    "lights off in here|kill the {room} lights|lamp off in the {room}|turn off the lamp|shut the {room} "
    "lights off|lights out|switch the {room} light off|turn off all lights",
    "upload_file": "upload {file}|put {file} in the cloud|upload {file} and share it|back up {file}|send "
    "{file} to cloud storage|upload {file} to my drive|share link for {file}|save {file} to the cloud|"
    "upload this file|get me a link to share {file}|store {file} online|upload {file} to dropbox",
}
