"""Training-only clauses built from a per-tool lexicon in frames every tool shares.

A lexicon clause is FRAME with ``{v}`` = one of the tool's verb phrases and ``{o}`` = one of
its object phrases (with ``{slot}`` holes filled like templates). The frames are the same for
all 64 tools, so only the tool's own words tell its clauses apart: this teaches a model to key
on what a request asks for rather than on the wording of the five training templates.
Lexicon clauses never enter validation or test examples, and a clause that happens to equal a
held-out template is never drawn (``toolcall.models.recipe.data`` checks it).
"""
from __future__ import annotations

FRAMES = ("{v} {o}", "please {v} {o}", "can you {v} {o}", "I want you to {v} {o}", "I need to {v} {o}",
          "could you {v} {o} for me", "{v} {o} please", "go ahead and {v} {o}", "help me {v} {o}",
          "I'd like to {v} {o}", "quickly {v} {o}", "I need you to {v} {o} now")
# Frames without the verb: the object alone must name the tool (questions and fragments).
OBJECT_FRAMES = ("what is {o}", "what about {o}", "do you know {o}", "{o}", "any update on {o}", "how about {o}",
                 "I'd like to know {o}", "I'm asking about {o}")

# tool -> "verb phrases ; object phrases", each list "/"-separated.
LEXICON = {
    "search_flights": "find/search for/look up/show me/compare; flights to {city2}/flights from {city} to {city2} "
    "{day}/cheap flights to {city2}/flight options from {city}/available flights to {city2} {day}/"
    "the flights leaving for {city2} {day}",
    "book_flight": "book/reserve/buy/get me; a flight to {city2}/a plane ticket to {city2} {day}/a seat on the "
    "flight to {city2}/the {time} flight from {city}/a flight for {person}",
    "cancel_flight": "cancel/call off/undo; my flight to {city2}/the flight from {city} {day}/my plane ticket to "
    "{city2}/{person}'s flight/my flight booking",
    "check_flight_status": "check/look up/show me/tell me; the status of flight {flightno}/the delay on flight "
    "{flightno}/my flight status for {city2}/the arrival time of flight {flightno}",
    "search_hotels": "find/search for/look up/show me; hotels in {city}/a cheap hotel in {city}/hotel rooms "
    "available in {city} {day}/hotels near {place}",
    "book_hotel": "book/reserve/get me; a hotel room in {city}/a room at the {hotel}/{nights} nights at the "
    "{hotel}/a hotel in {city} for {day}",
    "cancel_hotel": "cancel/call off/undo; my hotel reservation in {city}/the room at the {hotel}/my hotel "
    "booking for {day}/my stay at the {hotel}",
    "search_restaurants": "find/search for/look up/recommend; a {cuisine} restaurant in {city}/restaurants near "
    "{place}/good places to eat in {city}/{cuisine} restaurants nearby/"
    "somewhere to eat {cuisine} food/{cuisine} food near {place}/a place to have dinner in {city}",
    "book_restaurant_table": "book/reserve/get us; a table for {party} at {restaurant}/a table at {restaurant} at "
    "{time}/a dinner table for {party} {day}/a table at a {cuisine} restaurant",
    "get_weather": "check/tell me/show me/get; the weather in {city}/the current weather in {city}/the "
    "temperature in {city} right now/today's weather in {city}/the weather conditions in {city} now/"
    "the temperature outside in {city}/the weather in {city} today",
    "get_forecast": "check/tell me/show me/get; the forecast for {city}/the weather forecast for {city} "
    "{fday}/the rain forecast for {city} {fday}/the forecast for the next {n} days in {city}/"
    "the weather for {city} {fday}",
    "create_calendar_event": "add/create/schedule/put; {event} in my calendar {day}/a calendar event for {event} "
    "at {time}/a meeting with {person} {day}/an event called {event}/"
    "a meeting with {person} at {time}/a new appointment {day}",
    "update_calendar_event": "move/reschedule/change/update; {event} to {day}/the calendar event {event} to "
    "{time}/the time of {event} in my calendar/{event} to start at {time}/"
    "the start of {event} to {time}/{event} to a later time",
    "delete_calendar_event": "delete/remove/clear/erase; {event} from my calendar/the calendar event {event}/the "
    "{event} on my calendar {day}/{event} from my schedule",
    "list_calendar_events": "show/list/check/tell me; my calendar for {range}/my events {day}/the meetings on "
    "my calendar {day}/my schedule for {day}/my appointments {range}/"
    "my meetings {day}/my agenda for {day}",
    "find_meeting_time": "find/suggest/look for; a time to meet {person}/a free slot for a meeting with "
    "{person}/a meeting time that works for {person} and {person2}/a common free time for {person} and me",
    "send_email": "send/write/compose/shoot; an email to {person}/{person} an email about {topic}/a mail to "
    "{email}/an email to {person} saying {msg}",
    "read_email": "read/open/check/show me/go through; my emails/my inbox/the latest email from {person}/my "
    "unread emails/the new emails in my inbox/the mail from {person}/"
    "my new mail/the most recent email from {person}",
    "search_email": "search/look through/search through/dig through; my email for {keyword}/my inbox for emails "
    "about {keyword}/the emails from {person} about {keyword}/my mail for {keyword}",
    "send_text_message": "send/text/write/shoot; a text message to {person}/{person} a text that {msg}/an sms to "
    "{phone}/a quick text to {person}",
    "make_phone_call": "call/phone/ring/dial; {person}/{phone}/{person} on the mobile/the number {phone}/{person} "
    "right away",
    "add_contact": "add/save/create/store; {person} to my contacts/a new contact for {person}/{person}'s number "
    "{phone} in my contacts/a contact named {person} {surname}",
    "lookup_contact": "look up/find/get/show me; {person}'s phone number/{person}'s email address/the contact "
    "details of {person}/{person} {surname} in my contacts/"
    "the number of {person} {surname}/{person}'s contact info",
    "convert_currency": "convert/change/turn/exchange; {amount} {cur} to {cur2}/{amount} {cur} into {cur2}/my "
    "{amount} {cur} into {cur2}",
    "get_exchange_rate": "check/tell me/show me/get; the exchange rate between {cur} and {cur2}/the {code} to "
    "{code2} rate/today's {code} {code2} exchange rate/the current rate from {code} to {code2}/"
    "the {cur} to {cur2} exchange rate",
    "get_stock_price": "check/tell me/show me/get; the stock price of {stock}/the share price of {stock}/the "
    "latest quote for {ticker}/{ticker} stock today",
    "check_account_balance": "check/tell me/show me/get; my bank balance/the balance of my {account} "
    "account/the money left in my {account} account/my current balance/"
    "how much money I have in {account}",
    "transfer_money": "transfer/send/wire/move; {amount} {cur} to {person}/{amount} {cur} from {account} to "
    "{account2}/money to {person}'s account/{amount} {cur} into my {account} account",
    "pay_invoice": "pay/settle/clear; invoice {invoice}/the {vendor} invoice/the outstanding invoice from "
    "{vendor}/my {vendor} bill/the invoice due {day}/"
    "the {vendor} bill due {day}",
    "list_transactions": "list/show/check/go through; my recent transactions/the transactions on my {account} "
    "account/my card purchases {range}/my spending {range}/my latest bank transactions/"
    "my payments {range}/the charges on my card {range}",
    "create_reminder": "set/create/add/make; a reminder to {task}/a reminder for {day} at {time}/a reminder to "
    "{task} {day}/"
    "a reminder at {time} to {task}",
    "set_alarm": "set/create/add/schedule; an alarm for {time}/my alarm clock to {time}/a wake-up alarm at "
    "{time}/an alarm {day} at {time}",
    "start_timer": "start/set/run/begin; a timer for {duration}/a {duration} timer/a countdown of "
    "{duration}/a {duration} countdown timer",
    "create_task": "add/create/make/put; a task to {task}/{task} on my to-do list/a to-do item to {task}/a new "
    "task for the {project} project",
    "list_tasks": "list/show/check/go through; my open tasks/my to-do list/the tasks due {day}/the tasks left "
    "for the {project} project/my remaining tasks",
    "complete_task": "mark/check off/complete/cross off; the task {task} as done/{task} on my to-do list/my task "
    "to {task}/the {task} task as completed",
    "create_note": "write/create/take/make; a note that {notetext}/a note called {title}/a new note about "
    "{title}/a note saying {notetext}/"
    "a quick note: {notetext}",
    "search_notes": "search/look through/find/check; my notes for {keyword}/the note about {title}/notes "
    "mentioning {keyword}/my notes about {title}",
    "translate_text": "translate/convert/put/render; {phrase} into {lang}/{phrase} to {lang}/this text to "
    "{lang}: {phrase}/the phrase {phrase} in {lang}",
    "detect_language": "detect/identify/figure out/tell me; the language of {fphrase}/the language of this "
    "text: {fphrase}/the source language of {fphrase}",
    "define_word": "define/explain/look up/give me; the word {word}/{word} in the dictionary/the definition of "
    "{word}/the meaning of {word}",
    "summarize_document": "summarize/sum up/condense/give me; {doc}/a summary of {doc}/the key points of "
    "{doc}/{doc} in a short summary/"
    "the gist of {doc}/a short version of {doc}",
    "search_web": "search/google/look up/search online for; {query}/the web for {query}/{query} on the "
    "internet/websites about {query}",
    "get_news": "read me/show me/get/check; the latest news on {topic}/today's headlines/the news from "
    "{city}/the top headlines about {topic}/the news in {region}",
    "search_wikipedia": "look up/search/check/open; {wiki} on wikipedia/wikipedia for {wiki}/the wikipedia "
    "article on {wiki}/the wikipedia page about {wiki}",
    "calculate": "calculate/compute/work out/solve; {expr}/the result of {expr}/the math for {expr}/the "
    "answer to {expr}",
    "convert_units": "convert/change/turn/express; {qty} to {tounit}/{qty} into {tounit}/{qty} in {tounit}",
    "get_time_zone": "check/tell me/show me/get; the time in {city}/the local time in {city}/the time zone of "
    "{city}/the current time in {city}/"
    "the current hour in {city}",
    "get_directions": "get/give me/show me/find; directions to {place}/the route from {place} to "
    "{place2}/the way to {place} by {mode}/the fastest route to {place}/"
    "the directions from {place} to {place2}/the best way to get to {place}",
    "get_traffic": "check/tell me/show me/get; the traffic on {road}/traffic conditions near {place}/the "
    "traffic in {city}/traffic jams on {road}",
    "book_taxi": "book/order/get me/call me; a taxi to {place}/a cab to {place}/a taxi for {time}/a cab from "
    "{place} to {place2}/"
    "a ride to {place}",
    "search_train_tickets": "find/search for/look up/show me; trains to {city2}/train tickets from {city} to "
    "{city2}/the next train to {city2}/train connections to {city2} {day}/"
    "the price of a train ticket to {city2}/rail tickets to {city2}/the train fare from {city} to {city2}",
    "track_package": "track/check/find/locate; my package/the parcel {trackno}/my package from {shop}/the "
    "delivery status of package {trackno}/"
    "the shipping status of my order from {shop}",
    "order_food_delivery": "order/get/have/send me; {dish} for delivery/{dish} delivered from "
    "{restaurant}/some {cuisine} food delivered/a delivery from {restaurant}",
    "play_music": "play/put on/start playing/listen to; {song}/some {genre} music/songs by {artist}/my "
    "{playlist} playlist/music by {artist}/"
    "the song {song}/my {playlist} playlist on shuffle",
    "pause_music": "pause/stop/halt/hold; the music/this song/the playback/the music that is playing/what's "
    "playing/"
    "the song for a moment",
    "create_playlist": "create/make/build/put together; a playlist called {playlist}/a new {genre} playlist/a "
    "playlist of {artist} songs/a playlist for {activity}",
    "search_movies": "find/search for/look up/show me; {genre} movies nearby/showtimes for {movie}/the movie "
    "{movie}/movies playing {day}/movies showing in {city}/"
    "films showing {day}/the cinema program in {city}",
    "buy_movie_tickets": "buy/get/purchase/grab; {n} tickets for {movie}/movie tickets for {movie} {day}/a "
    "ticket for the {time} showing of {movie}/cinema tickets for {movie}",
    "get_sports_score": "check/tell me/show me/get; the score of the {team} game/the latest {sport} "
    "scores/the winner of the {team} match/the result of {team} vs {team2}/"
    "the {team} game result/the final score of the {team} match",
    "set_thermostat": "set/change/adjust/turn; the thermostat to {temp} degrees/the heating to {temp} "
    "degrees/the temperature at home to {temp}/the house to {temp} degrees",
    "turn_on_lights": "turn on/switch on/put on; the lights in the {room}/the {room} lights/the light in the "
    "{room}/all the lights",
    "turn_off_lights": "turn off/switch off/shut off; the lights in the {room}/the {room} lights/the light in "
    "the {room}/all the lights",
    "upload_file": "upload/back up/store/put; {file} to the cloud/{file} to cloud storage/{file} on my cloud "
    "drive/{file} with a share link",
}


def lexicon_clauses(tool: str) -> list[str]:
    """Every frame x verb x object and object frame x object pattern of ``tool`` (with {slot} holes),
    in a fixed order."""
    verbs, objects = ([w.strip() for w in part.split("/")] for part in LEXICON[tool].split(";"))
    return ([f.format(v=v, o=o) for f in FRAMES for v in verbs for o in objects]
            + [f.format(o=o) for f in OBJECT_FRAMES for o in objects])
