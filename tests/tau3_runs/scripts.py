"""What the stub model plays in each recorded simulation (record.py runs them through upstream's `tau2 run`).

Telecom: together the scripts call every user tool on the phone at least once, interleave the two actors on the
shared world (a user payment that fails before the agent's payment request, the request, the user's payment,
the agent resuming the line), make calls that fail,
hit upstream's error limit (too_many_errors), and crash the way upstream records crashes (a model that keeps
failing: infrastructure_error, no messages).
banking_knowledge: discovery (unlocking an agent tool, calling it before and after; giving the user a tool),
retrieval with the offline BM25 retriever and grep, database writes, errors, and a crash (a user model answer
upstream cannot build a message from).
The arguments come from the tasks' own golden actions where a script is meant to succeed.
"""

from __future__ import annotations

import json

from stub_model import Empty, Fail, Say, Script, call, calls

PHONE = "555-123-2002"
CUSTOMER, LINE = "C1001", "L1002"

APN_BROKEN = {"apn_name": "broken", "mmsc_url": None}

TELECOM = (
    Script(
        "telecom",
        "[mobile_data_issue]user_abroad_roaming_enabled_off[PERSONA:None]",
        note="roaming off on the phone while abroad; the user reads most of the phone, toggles roaming, tests speed",
        agent=(
            calls(call("get_customer_by_phone", phone_number=PHONE)),
            calls(call("get_details_by_id", id=LINE), call("get_data_usage", customer_id=CUSTOMER, line_id=LINE)),
            Say("Please check your status bar, network status and SIM, and tell me what you see."),
            Say("Please check your mobile data restrictions, network mode, APN, Wi-Fi, Wi-Fi calling and VPN."),
            calls(call("enable_roaming", customer_id=CUSTOMER, line_id=LINE)),
            Say("Roaming is enabled on your line. Please turn on data roaming on your phone and run a speed test."),
            Say("Glad it works. ###STOP###"),
        ),
        user=(
            Say("Hi, my mobile data is not working here in France. I am John Smith, 555-123-2002."),
            calls(call("check_status_bar"), call("check_network_status"), call("check_sim_status")),
            Say("The status bar shows signal but mobile data is not working; the SIM is active."),
            calls(
                call("check_data_restriction_status"),
                call("check_network_mode_preference"),
                call("check_apn_settings"),
            ),
            calls(call("check_wifi_status"), call("check_wifi_calling_status"), call("check_vpn_status")),
            Say("Data saver is off, the network mode is 4G/5G preferred, APN is internet, Wi-Fi is off, no VPN."),
            calls(call("toggle_roaming")),
            calls(call("run_speed_test")),
            Say("The speed test says excellent. Thanks! ###STOP###"),
        ),
        reward=1.0,
    ),
    Script(
        "telecom",
        "[service_issue]airplane_mode_on|overdue_bill_suspension[PERSONA:None]",
        note="dual control: the user tries to pay before the agent sent a payment request (fails: the user's call "
        "needs the agent's), the agent sends it, the user pays (upstream syncs the payment into the agent's DB), the "
        "agent resumes the line, the user turns airplane mode off and reboots",
        agent=(
            calls(call("get_customer_by_phone", phone_number=PHONE)),
            Say("Please check your status bar and pay any payment request you have."),
            calls(call("get_bills_for_customer", customer_id=CUSTOMER)),
            calls(call("send_payment_request", customer_id=CUSTOMER, bill_id="B1234321")),
            Say("I sent you a payment request for the overdue bill. Please check it and pay it."),
            calls(call("get_details_by_id", id="B1234321")),
            calls(call("resume_line", customer_id=CUSTOMER, line_id=LINE)),
            Say("Your line is active again. Please turn off airplane mode and reboot your phone."),
            Say("Great. ###STOP###"),
        ),
        user=(
            Say("Hello, my phone shows No Service for hours. John Smith, 555-123-2002."),
            calls(call("check_status_bar")),
            calls(call("make_payment")),
            Say("It shows airplane mode, and I have no payment request."),
            calls(call("check_payment_request")),
            calls(call("make_payment")),
            Say("I paid the bill."),
            calls(call("toggle_airplane_mode")),
            calls(call("reboot_device")),
            calls(call("check_status_bar")),
            Say("I have signal now, thank you. ###STOP###"),
        ),
        reward=1.0,
    ),
    Script(
        "telecom",
        "[mms_issue]break_app_sms_permission[PERSONA:None]",
        note="every remaining user tool, failing calls on both sides (an unknown app, an invalid network mode, "
        "a broken APN, an unknown tool), a data refuel; ends with a transfer and the MMS still broken",
        agent=(
            calls(call("get_customer_by_name", full_name="John Smith", dob="1985-06-15")),
            calls(call("get_customer_by_id", customer_id=CUSTOMER)),
            Say("Please check whether you can send an MMS and which apps are installed."),
            Say("Please check the messaging app's status and permissions."),
            calls(call("refuel_data", customer_id=CUSTOMER, line_id=LINE, gb_amount=2.0)),
            calls(call("disable_roaming", customer_id=CUSTOMER, line_id=LINE)),
            calls(call("suspend_line", customer_id=CUSTOMER, line_id="L9999", reason="test")),
            Say("Please try toggling mobile data, data saver, Wi-Fi and Wi-Fi calling, then reset the APN."),
            Say("Please reseat your SIM card and set the network mode."),
            calls(call("transfer_to_human_agents", summary="MMS still failing after troubleshooting.")),
            Say("YOU ARE BEING TRANSFERRED TO A HUMAN AGENT. PLEASE HOLD ON."),
        ),
        user=(
            Say("Hi, I cannot send MMS messages. I'm John Smith, phone 555-123-2002, at home in the US."),
            calls(call("can_send_mms"), call("check_installed_apps")),
            Say("I cannot send MMS; messaging, browser and settings apps are installed."),
            calls(call("check_app_status", app_name="messaging"), call("check_app_permissions", app_name="messaging")),
            calls(call("check_app_status", app_name="no_such_app")),
            calls(call("grant_app_permission", app_name="browser", permission="storage")),
            Say("The messaging app is running; I granted the browser storage."),
            calls(call("toggle_data"), call("toggle_data"), call("toggle_data_saver_mode")),
            calls(call("toggle_wifi"), call("toggle_wifi_calling"), call("connect_vpn"), call("disconnect_vpn")),
            calls(call("set_apn_settings", apn_settings=APN_BROKEN)),
            calls(call("reset_apn_settings")),
            Say("Done, still no MMS."),
            calls(call("reseat_sim_card"), call("set_network_mode_preference", mode="6g_only")),
            calls(call("set_network_mode_preference", mode="4g_only"), call("send_fax")),
            calls(call("toggle_airplane_mode"), call("toggle_airplane_mode")),
            Say("Still not working."),
            Say("OK. ###TRANSFER###"),
        ),
        termination="user_stop",
        reward=0.0,
    ),
    Script(
        "telecom",
        "[service_issue]unseat_sim_card[PERSONA:Easy]",
        note="after the user's look at the phone the agent makes ten failing calls in one turn: upstream ends the "
        "simulation at its error limit (too_many_errors)",
        agent=(
            calls(call("get_customer_by_phone", phone_number=PHONE)),
            Say("Please check your status bar."),
            calls(*(call("get_details_by_id", id=f"L{9000 + k}") for k in range(10))),
            Say("Let me look again."),
        ),
        user=(
            Say("My phone says no service since this morning. This is John Smith, 555-123-2002."),
            calls(call("check_status_bar")),
            Say("It says no signal."),
        ),
        termination="too_many_errors",
        reward=0.0,
    ),
    Script(
        "telecom",
        "[mobile_data_issue]data_mode_off[PERSONA:None]",
        note="the agent's model keeps failing (HTTP 500): upstream retries the simulation, then records "
        "infrastructure_error with no messages",
        agent=(Fail(),),
        user=(Say("My mobile data does not work at all. John Smith, 555-123-2002."),),
        termination="infrastructure_error",
        reward=None,
    ),
)

REPLACEMENT = json.dumps(
    {
        "credit_card_account_id": "cc_890389b165_silver",
        "user_id": "890389b165",
        "shipping_address": "2500 Woodward Avenue, Suite 300, Detroit, MI 48201",
        "reason": "fraud_suspected",
        "expedited_shipping": True,
    }
)
FATIMA = {
    "name": "Fatima Al-Hassan",
    "user_id": "890389b165",
    "address": "1923 Oak Park Boulevard, Detroit, MI 48226",
    "email": "coffeelover_fati@protonmail.com",
    "phone_number": "313-555-0246",
    "date_of_birth": "12/05/1993",
    "time_verified": "2025-11-14 03:40:00 EST",
}

BANKING = (
    Script(
        "banking_knowledge",
        "task_036",
        note="retrieval (BM25 search, grep), verification, a discoverable tool called before it is unlocked "
        "(upstream answers with an error text), unlocked, then called (a DB write); an unknown tool",
        agent=(
            calls(call("get_user_information_by_email", email="coffeelover_fati@protonmail.com")),
            calls(call("log_verification", **FATIMA)),
            calls(call("KB_search", query="replace credit card suspected fraud")),
            calls(call("grep", pattern="order_replacement_credit_card")),
            calls(
                call(
                    "call_discoverable_agent_tool",
                    agent_tool_name="order_replacement_credit_card_7291",
                    arguments=REPLACEMENT,
                )
            ),
            calls(call("unlock_discoverable_agent_tool", agent_tool_name="order_replacement_credit_card_7291")),
            calls(
                call(
                    "call_discoverable_agent_tool",
                    agent_tool_name="order_replacement_credit_card_7291",
                    arguments=REPLACEMENT,
                )
            ),
            calls(call("unlock_discoverable_agent_tool", agent_tool_name="no_such_tool_0000")),
            calls(call("get_credit_card_accounts_by_user", user_id="890389b165")),
            Say("I ordered a replacement card with expedited shipping to your business address."),
            Say("You're welcome. ###STOP###"),
        ),
        user=(
            Say("Hi, my Silver Rewards Card balance looks wrong, I think there is fraud. Fatima Al-Hassan here."),
            Say("Please send the replacement to 2500 Woodward Avenue, Suite 300, Detroit, MI 48201, expedited."),
            Say("Thank you! ###STOP###"),
        ),
        reward=1.0,
    ),
    Script(
        "banking_knowledge",
        "task_015",
        note="the agent gives the user a discoverable tool; the user calls one it was not given, then the given one",
        agent=(
            calls(call("KB_search", query="referral link credit card")),
            calls(call("give_discoverable_user_tool", discoverable_tool_name="get_referral_link")),
            Say("I gave you a tool to get your referral link; please call it with your user id and card name."),
            Say("Great, that is your link. ###STOP###"),
        ),
        user=(
            Say("Hello, I keep getting referral emails and want my Platinum Rewards Card referral link. Fatima."),
            calls(call("list_discoverable_user_tools")),
            calls(
                call(
                    "call_discoverable_user_tool",
                    discoverable_tool_name="submit_cash_back_dispute_0589",
                    arguments=json.dumps({"user_id": "890389b165", "transaction_id": "x"}),
                )
            ),
            calls(
                call(
                    "call_discoverable_user_tool",
                    discoverable_tool_name="get_referral_link",
                    arguments=json.dumps({"user_id": "890389b165", "card_name": "Platinum Rewards Card"}),
                )
            ),
            Say("Got it, thanks! ###STOP###"),
        ),
        reward=1.0,
    ),
    Script(
        "banking_knowledge",
        "task_001",
        note="the user applies for the wrong card (reward 0); the agent looks the user up by name (not found)",
        agent=(
            calls(call("get_user_information_by_name", customer_name="Sarah Bosch")),
            calls(call("KB_search", query="credit card cash back no annual fee")),
            Say("The Bronze Rewards Card has no annual fee."),
            Say("Good luck. ###STOP###"),
        ),
        user=(
            Say("Hi, I'm Sarah Bosch and I want a credit card with the most cash back for everyday purchases."),
            calls(
                call(
                    "apply_for_credit_card",
                    card_type="Bronze Rewards Card",
                    customer_name="Sarah Bosch",
                    annual_income=100000,
                    rho_bank_subscription=True,
                )
            ),
            Say("I applied. ###STOP###"),
        ),
        reward=0.0,
    ),
    Script(
        "banking_knowledge",
        "task_002",
        note="the user simulator's model answers with neither text nor tool calls after the agent's search: upstream "
        "cannot build the message, retries the simulation, then records infrastructure_error with no messages",
        agent=(
            calls(call("KB_search", query="highest cash back credit card")),
            Say("Which card features matter most to you?"),
        ),
        user=(Say("Hi, I'm Sera Chen from the EPA and I want the highest cash back card you have."), Empty()),
        termination="infrastructure_error",
        reward=None,
    ),
)

SCRIPTS = TELECOM + BANKING
