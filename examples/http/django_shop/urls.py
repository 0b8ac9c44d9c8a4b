"""The example shop's routes."""

from __future__ import annotations

from django.urls import path

from examples.http.django_shop import views

urlpatterns = [
    path("charges", views.charges),
    path("drf/charges", views.DrfCharges.as_view()),
    path("async/charges", views.async_charges),
    path("export", views.export),
    path("notes", views.notes),
]
