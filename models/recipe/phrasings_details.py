"""Training-only phrasings with details inside one clause (numbers, names, times) and with the thing
named before the action, reusing each catalog description's own verbs and nouns ("reserve a room",
"switch on", "evaluate", "order a ride").

Four a tool, written from the catalog's tool descriptions (builder/data/tools-64.json) by a writer who
did not open the hand-written test set (models/recipe/handwritten.tsv) and wrote no line from an
evaluation request. Same format and decontamination as toolcall.models.recipe.phrasings_everyday:
"|"-separated, {slot} holes, dropped when near a held-out template (toolcall.models.recipe.data.near_held_out).
They join the training phrasings with ``Wording.extra`` (train.py ``--extra``).
"""
from __future__ import annotations

DETAIL_PHRASINGS = {
    "search_flights": "flights between {city} and {city2} leaving {day}|which airports near {city} have flights out {day}|"
    "show me flight dates from {city} to {city2}|any flight {city} -> {city2} {day}",
    "book_flight": "a seat on that flight for {person}, please book it|put {person} on the {time} flight to {city2}|"
    "passenger {person} {surname}, book the flight|confirm a seat for me on flight {flightno}",
    "cancel_flight": "i want a refund for my flight booking|cancel that flight booking to {city2} and refund me|"
    "the flight on {day} has to be cancelled|drop my booking on flight {flightno}",
    "check_flight_status": "is {flightno} delayed|departure time of {flightno} today|"
    "has the {city} flight been delayed|arrival and delay info for {flightno}",
    "search_hotels": "check-in {day}, {nights} nights, hotels in {city}|find me somewhere to check in near {place}|"
    "hotel options in {city} from {day}|rooms available in {city} around {day}",
    "book_hotel": "reserve a room for {nights} nights at {hotel}|a room at {hotel} from {day}, book it|"
    "i'll take the room at {hotel}, reserve it|reserve {hotel} for me and {person}",
    "cancel_hotel": "cancel the reservation at {hotel}|my room booking in {city} for {day}, cancel it|"
    "we won't need the hotel room, cancel the reservation|call off the {hotel} booking",
    "search_restaurants": "well rated {cuisine} places near {place}|restaurants around {place} that aren't expensive|"
    "find {cuisine} food near {place} with good ratings|somewhere to eat in {city} by rating",
    "book_restaurant_table": "reserve a table at {restaurant} for {party} at {time}|a table for {party}, {day} at {time}, at {restaurant}|"
    "book {restaurant} for {party} people|get a dinner table for {party} at {time}",
    "get_weather": "current weather at {place}|weather conditions in {city} now|"
    "what are conditions like outside in {city}|is it windy in {city} at the moment",
    "get_forecast": "forecast for the coming days in {city}|what will the weather be in {city} {fday}|"
    "will it rain in {city} {fday}|next few days of weather for {city}",
    "create_calendar_event": "add {event} to the calendar on {day} at {time}|calendar: {event}, {day}, {time}, with {person}|"
    "put an event on my calendar for {day} called {event}|schedule {event} at {time} and invite {person}",
    "update_calendar_event": "change the time of {event} to {time}|push {event} back to {day}|"
    "rename {event} and move it to {time}|add {person} to the attendees of {event}",
    "delete_calendar_event": "remove {event} from the calendar|take {event} off my calendar for {day}|"
    "{event} is cancelled, remove it from my calendar|delete the {time} event on {day}",
    "list_calendar_events": "what events are on my calendar {range}|list everything on the calendar {range}|"
    "calendar events between now and {day}|show my schedule for {range}",
    "find_meeting_time": "suggest a time slot for me and {person}|when are {person} and {person2} both free {range}|"
    "find a slot that works for the whole team {range}|a free time for {person} and me to meet",
    "send_email": "email {person} about {topic}|send an email to {email} saying {msg}|"
    "write to {person} and {person2} by email: {msg}|mail {email} that {msg}",
    "read_email": "read me my inbox|any new messages in my inbox from {person}|"
    "open the latest emails from {person}|read the mail {person} sent me",
    "search_email": "search my emails for {keyword}|find the email from {person} about {keyword}|"
    "emails mentioning {keyword} from {range}|look through my mail for {keyword}",
    "send_text_message": "send an sms to {phone}: {msg}|text {person} saying {msg}|"
    "message {person} on their phone that {msg}|sms {person}: {msg}",
    "make_phone_call": "start a call to {phone}|phone {person} right now|"
    "give {person} a ring|place a call to {person} {surname}",
    "add_contact": "save a new contact: {person} {surname}, {phone}|add {person} with email {email} to my contacts|"
    "store {phone} under {person}|new contact {person}, phone {phone}, email {email}",
    "lookup_contact": "what's the address of {person}|find {person} {surname}'s email|"
    "look up the phone number for {person}|contact details for {person}",
    "convert_currency": "convert {amount} {cur} into {cur2}|how many {cur2} do i get for {amount} {cur}|"
    "{amount} {code} in {code2}|change {amount} {cur} to {cur2} at today's rate",
    "get_exchange_rate": "today's rate between {code} and {code2}|{code} to {code2} exchange rate|"
    "what is the rate of the {cur} against the {cur2}|current {cur} to {cur2} rate",
    "get_stock_price": "latest price of {stock} stock|how much did {ticker} change today|"
    "{ticker} share price|daily change of {stock} shares",
    "check_account_balance": "balance of my {account} account|what's left in my {account} account|"
    "show the {account} balance|how much money is in {account}",
    "transfer_money": "transfer {amount} {cur} to {person}|move {amount} from {account} to {account2}|"
    "send {person} {amount} {cur} from my {account} account|pay {amount} to {person} by bank transfer",
    "pay_invoice": "pay invoice {invoice} from {account}|settle the {vendor} invoice|"
    "invoice {invoice} needs paying, use my {account} account|pay the open invoice {invoice}",
    "list_transactions": "recent transactions on my {account} account|what did i spend {range}|"
    "list the payments from my {account} account {range}|show account activity for {range}",
    "create_reminder": "set a reminder for {day} at {time}: {task}|remind me {day} to {task}|"
    "a reminder to {task} at {time}|don't let me forget to {task} {day}",
    "set_alarm": "set an alarm at {time}|wake me at {time} {day}|"
    "alarm for {time} please|i need an alarm at {time} tomorrow",
    "start_timer": "count down {duration}|start a countdown for {duration}|"
    "a {duration} timer for the {cook}|time {duration} for me",
    "create_task": "add {task} to the to-do list|new task: {task}, due {day}|"
    "put {task} on my to-do list for {day}|to-do: {task}",
    "list_tasks": "what's on my to-do list|open tasks for the {project} project|"
    "which tasks are due {day}|list what i still have to do",
    "complete_task": "mark {task} as done|{task} is done, tick it off the list|"
    "i did {task}, mark it done|close the task {task}",
    "create_note": "write a note titled {title}: {notetext}|new note: {notetext}|"
    "jot down {notetext}|make a note called {title}",
    "search_notes": "find my notes with {keyword} in them|which note mentions {keyword}|"
    "search notes for {keyword}|the note where i wrote about {keyword}",
    "translate_text": "translate {phrase} into {lang}|put {phrase} in {lang}|"
    "{phrase} in {lang} please|translation of {phrase} to {lang}",
    "detect_language": "which language is {fphrase} written in|tell me the language of {fphrase}|"
    "{fphrase}, what language is that|identify the language: {fphrase}",
    "define_word": "dictionary definition for {word}|the definition of {word}, please|"
    "what's the dictionary say about {word}|{word}: give me the definition",
    "summarize_document": "summarize the content of {doc}|short summary of {file}|"
    "give me the gist of {doc}|summarize this web page for me",
    "search_web": "search the web for {query}|top results for {query}|"
    "look online for {query}|web search: {query}",
    "get_news": "latest headlines about {topic}|news from {region}|"
    "what's in the news about {topic} today|top stories in {region}",
    "search_wikipedia": "the wikipedia article on {wiki}|look up {wiki} on wikipedia|"
    "what does wikipedia say about {wiki}|open the wiki page for {wiki}",
    "calculate": "evaluate {expr}|what does {expr} come to|"
    "result of {expr}|arithmetic: {expr}",
    "convert_units": "convert {qty} to {tounit}|{qty} in {tounit}|"
    "how many {tounit} is {qty}|change {qty} into {tounit}",
    "get_time_zone": "local time in {city}|which time zone is {city} in|"
    "what time is it now in {city}|current time and time zone for {city}",
    "get_directions": "route to {place} by {mode}|how long does it take to get to {place} by {mode}|"
    "directions from {place} to {place2}|the way to {place} on foot",
    "get_traffic": "traffic conditions on {road}|is {road} jammed right now|"
    "current traffic around {place}|how bad is traffic on the route to {place}",
    "book_taxi": "order a taxi to {place}|get me a ride to {place} at {time}|"
    "a cab to {place} for {party}|send a taxi to pick me up at {time}",
    "search_train_tickets": "train connections from {city} to {city2}|fares for the train to {city2} {day}|"
    "rail tickets {city} to {city2}|which trains go to {city2} {day}",
    "track_package": "delivery status of {trackno}|where is package {trackno}|"
    "track my parcel {trackno}|has my {shop} package been delivered",
    "order_food_delivery": "order {dish} for delivery from {restaurant}|deliver {dish} to my place|"
    "get {dish} delivered from {restaurant}|i want to order a meal from {restaurant}",
    "play_music": "play the album by {artist}|put on {song}|"
    "play my {playlist} playlist|some {genre} music please",
    "pause_music": "pause the music|stop the song for a second|"
    "pause what's playing|hold the music",
    "create_playlist": "create a playlist called {playlist} with {song} and {song2}|new playlist {playlist}: {song}, {song2}|"
    "make a {genre} playlist|a playlist of {song} and songs by {artist}",
    "search_movies": "find {genre} movies|showtimes for {movie} nearby|"
    "movies with {movie} in the title|what films are playing near {place}",
    "buy_movie_tickets": "buy {n} tickets for {movie} at {time}|tickets to the {time} showing of {movie}|"
    "get me seats for {movie} {day}|{n} tickets for {movie}, please",
    "get_sports_score": "latest score of the {team} match|result of {team} vs {team2}|"
    "how did {team} do in their match|who won {team} against {team2}",
    "set_thermostat": "set the thermostat to {temp} degrees|target temperature {temp}|"
    "heat the house to {temp}|thermostat at {temp} please",
    "turn_on_lights": "switch on the lights in the {room}|lights on in the {room}, please|"
    "switch the {room} light on|i need light in the {room}",
    "turn_off_lights": "switch off the {room} lights now|the {room} lights, switch them off|"
    "no lights in the {room} please|lights in the {room} off",
    "upload_file": "upload {file} to the cloud and give me a share link|put {file} in cloud storage|"
    "share link for {file} after uploading it|back up {file} to the cloud",
}
